//! What gpuprof knows about CPython 3.8–3.13, shared by the eBPF agent (which walks frames in the
//! kernel and symbolizes here) and the in-process shim (which walks and symbolizes here):
//!
//! - `offsets`: the structure layout of each version, as data (tables checked against the real
//!   headers in the tests);
//! - `debug_offsets`: 3.13's `_Py_DebugOffsets`, the layout the interpreter publishes itself,
//!   mirrored field by field;
//! - `discovery`: which module of a process holds `_PyRuntime` (its maps and symbols read with
//!   `gpuprof_procfs`), and which version it is;
//! - `memory`: reading another process's memory (or our own);
//! - `code` + `linetable` + `strings`: code objects to `file:line function`, with a cache per
//!   code object;
//! - `autograd_layout`: where PyTorch keeps the autograd state that links a backward-pass block to
//!   the Python line of its forward op (libtorch_cpu's thread-locals, an autograd node's head).

#![warn(unreachable_pub)]

pub mod autograd_layout;
pub mod code;
pub(crate) mod debug_offsets;
pub(crate) mod discovery;
pub(crate) mod linetable;
pub mod memory;
pub mod offsets;
pub mod strings;

pub use code::Symbolizer;
pub use discovery::{find_interpreter, DiscoveryError, Interpreter};
pub use memory::{Memory, MemoryError, RemoteMemory};
pub use offsets::{InstrEncoding, Layout, LineTableFormat, Offsets, Version};
