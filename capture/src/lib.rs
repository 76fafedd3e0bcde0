//! gpuprof's capture: where events come from and the one way they go.
//!
//! capture → decode → enrich → flow → model → outputs:
//! - `kernel`: the eBPF programs loaded into the kernel, their probes on libcuda and libc10 and
//!   the records they write to the ring buffer;
//! - `shim_socket`: the socket the in-process shims send their events to (`run --via shim`, a
//!   pod's sidecar);
//! - `decode`: a ring-buffer record into an event, reading nothing else;
//! - `enrich`: what a record points at, read from the process it came from (callers' modules,
//!   Python stacks, autograd nodes' names, parents and namespaces from /proc);
//! - `flow`: every event, whichever source, through the tracker and leak rules
//!   (`gpuprof_model::Analyzer`) to the reporters (`gpuprof_model::Reporter`: the views' outputs
//!   and the OTLP reporter, each below the capture), handed the event and its findings alike;
//! - `postmortem`: a daemon's windows of each process's last seconds, written with their HTML
//!   report when a process runs out of memory or a leak finding fires;
//! - `session`: the one capture loop over those sources, its stop conditions and hooks, and the
//!   capture's statistics.
//!
//! `attach`, `run`, `top` and the daemon are configurations of a `session::Session`. Nothing here
//! prints: what a person is to read goes to the reporters as a notice, and the binary or the
//! views write it.

#![warn(unreachable_pub)]

pub mod clock;
pub mod decode;
pub(crate) mod enrich;
pub mod flow;
pub mod kernel;
pub mod libcuda;
pub mod nvml;
pub mod postmortem;
pub mod preflight;
pub mod session;
pub mod shim_library;
pub mod shim_socket;
pub mod signals;
