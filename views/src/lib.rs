//! gpuprof's views of events, for people and for the tools they already read.
//!
//! - `output`: where a live capture's events go (a recording, jsonl, a table) and what the end of
//!   a run says (live memory per process, the findings, what to run next), the terminal's live
//!   line and colours.
//! - `export`: views of a recorded file (folded stacks, flame graphs, speedscope, memory_viz, the
//!   HTML report, jsonl), `export::summary` (the lines that held the most) and `report` (the leak
//!   rules over a recorded file).
//! - `whatif`: a recording's allocator requests replayed under other allocator settings or on
//!   another device (docs/whatif.md).
//!
//! The ground is `gpuprof_model` (events, the tracker, findings) and `gpuprof_recording` (the
//! file format); nothing here captures.

#![warn(unreachable_pub)]

pub mod export;
pub(crate) mod input;
pub mod output;
pub mod report;
pub mod whatif;
