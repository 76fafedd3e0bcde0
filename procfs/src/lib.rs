//! What gpuprof reads from /proc: about other processes and the code they have loaded.
//!
//! - `maps`: `/proc/PID/maps`, parsed once into mappings, from which the files a process maps,
//!   its code ranges and its libraries' load bases are derived;
//! - `elf`: the symbols of a mapped file (exported functions and their file offsets, named
//!   symbols from the dynamic and static tables, thread-locals, the TLS module-id slot);
//! - `process`: existence, names, parents, namespaces and ranks of processes, and this process's
//!   own CPU time and resident memory.
//!
//! A crate of its own because the capture (libcuda and libc10 to probe, caller modules, parents
//! and namespaces), `gpuprof-pystack` (the module that holds `_PyRuntime`, libtorch_cpu's
//! thread-locals), the fleet (the daemon's own costs) and the binary all read /proc, and none of
//! them may depend on another for it.

#![warn(unreachable_pub)]

pub mod elf;
pub mod maps;
pub mod process;
