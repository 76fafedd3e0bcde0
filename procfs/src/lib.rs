//! What gpuprof reads about the code another process has loaded:
//!
//! - `maps`: `/proc/PID/maps`, parsed once into mappings, from which the files a process maps,
//!   its code ranges and its libraries' load bases are derived;
//! - `elf`: the symbols of a mapped file (exported functions and their file offsets, named
//!   symbols from the dynamic and static tables, thread-locals, the TLS module-id slot).
//!
//! A crate of its own because two crates need it and neither can host it: the agent (libcuda and
//! libc10 to probe, caller modules, PyTorch's load base) and `gpuprof-pystack` (the module that
//! holds `_PyRuntime`, libtorch_cpu's thread-locals), which must not depend on the agent. Inside
//! pystack, the agent would reach into the Python crate for libcuda's symbols.
//!
//! The rest of what gpuprof reads from /proc (names, parents, namespaces of processes) is the
//! agent's alone and stays there (`agent/src/procfs.rs`).

pub mod elf;
pub mod maps;
