//! gpuprof's shared model: the event and finding contract every output speaks
//! (`docs/events.md`), the in-process shim's contract with the agent (`shim`), the table of CUDA
//! driver entry points and what each one means, and the tracker that turns an event stream into
//! live allocations per process.
//!
//! Agent, `gpuprof report` and the collector all use these types and functions; none of them
//! re-implements what lives here.

#![warn(unreachable_pub)]

pub mod allocator;
pub mod bytes;
pub mod dedup;
pub mod driver_api;
pub mod escalation;
pub mod event;
pub mod findings;
pub mod forward_stacks;
pub mod framework;
pub mod hashing;
pub mod hex;
pub mod job;
pub mod level;
pub mod nvml;
pub mod otel;
pub mod postmortem;
pub mod rank;
pub mod report;
pub mod seconds;
pub mod shim;
pub mod stack;
pub mod start_environment;
pub mod track;
pub mod user_frame;

pub use driver_api::{ArgLayout, DriverApi, DRIVER_APIS};
pub use event::{Event, Frame, Kind, Layer, Op, Source};
pub use findings::{analyze, Analyzer, Diagnosis, Finding, FindingKind, RuleConfig, Severity};
pub use framework::Framework;
pub use level::Level;
pub use report::{EndOfRun, Notice, Reporter};
pub use stack::{Stack, StackTable};
pub use track::{LiveSummary, ProcessState, Tracker};
pub use user_frame::user_frame;
