//! The gpuprof agent: eBPF capture of CUDA memory calls and process lifecycle, decoding into the
//! event contract, tracking of live memory per process, and the local outputs.
//!
//! Data flows one way: `capture` (kernel) → `decode` → `python` (symbolize stacks) →
//! `gpuprof_model::Analyzer` (tracker and leak rules) → `output`; `session` runs that loop for `attach` and `run`, `daemon` for every
//! CUDA process of a node, `report` runs the rules over a recorded file.

pub mod autograd;
pub mod callers;
pub mod capture;
pub mod cli;
pub mod clock;
pub mod daemon;
pub mod decode;
pub mod export;
pub mod flow;
pub mod inject;
pub mod input;
pub mod libcuda;
pub mod nvml;
pub mod output;
pub mod pipeline;
pub mod preflight;
pub mod procfs;
pub mod python;
pub mod report;
pub mod session;
pub mod shim_socket;
pub mod signals;
pub mod telemetry;
pub mod top;
pub mod via_shim;
