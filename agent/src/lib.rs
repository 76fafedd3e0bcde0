//! The gpuprof agent: eBPF capture of CUDA memory calls and process lifecycle, decoding into the
//! event contract, tracking of live memory per process, and the local outputs.
//!
//! Data flows one way: `capture` (the kernel's records) → `decode` → `python` (symbolize stacks)
//! → `flow` (`gpuprof_model::Analyzer`: tracker and leak rules; `output`, `telemetry`).
//! `session` is the one capture loop, taking events from eBPF, the shim's socket or both;
//! `attach`, `run` (and `run::via_shim`), `daemon` and `top` configure it. `report` and `export`
//! read a recorded file. Modules are public only where a binary or a benchmark needs them.

pub mod attach;
pub(crate) mod autograd;
pub(crate) mod callers;
pub mod capture;
pub mod cli;
pub mod clock;
pub mod daemon;
pub mod decode;
pub mod export;
pub(crate) mod flow;
pub mod inject;
pub(crate) mod input;
pub(crate) mod libcuda;
pub(crate) mod nvml;
pub(crate) mod output;
pub(crate) mod preflight;
pub mod procfs;
pub(crate) mod python;
pub mod report;
pub mod run;
pub(crate) mod session;
pub(crate) mod shim_library;
pub(crate) mod shim_socket;
pub(crate) mod signals;
pub mod telemetry;
pub mod top;
