//! gpuprof-collector: OTLP in (gRPC and HTTP), per-node leak findings out (HTTP API,
//! Prometheus, OTLP spans to a trace backend), state in an embedded database. The binary
//! (`main.rs`) only runs the process; everything it serves is here, reachable without a network
//! (the fuzz targets decode requests and hand them to the core as the receivers do).

pub mod api;
pub mod collector;
pub mod config;
pub mod forward;
pub mod jobs;
pub mod prometheus;
pub mod receive;
pub mod reports;
pub mod state;
pub mod store;
