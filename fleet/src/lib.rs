//! gpuprof's fleet side: what runs on every GPU node and in pods, and what it sends.
//!
//! - `daemon`: `gpuprof daemon`, the node's capture for as long as it runs (a DaemonSet), or a
//!   pod's sidecar (the shims' events, no privileges), with its health, metrics and level
//!   endpoints;
//! - `inject`: `gpuprof inject`, the sidecar added to Kubernetes manifests.

#![warn(unreachable_pub)]

pub mod daemon;
pub mod inject;
