//! Where a finding's post-mortem is: a node's daemon (or a pod's sidecar) keeps the last seconds
//! of each process's events, and when one runs out of memory or a leak finding fires it writes
//! that window as a recording and its HTML report on the node, and sends the report to the
//! collector. The finding names all of it (`Finding::postmortem`), so a person goes from the
//! finding — in `gpuprof report`, Grafana or Jaeger — to the picture of the minute before it.

use serde::{Deserialize, Serialize};

/// The post-mortem of one finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Postmortem {
    /// The node whose directory holds the files.
    pub node: String,
    /// The recording of the window (`gpuprof report`, `export`, `whatif` read it), on that node.
    pub recording: String,
    /// Its HTML report, on that node.
    pub report: String,
    /// The window, ns since the Unix epoch: the recording's first instant (what the processes
    /// held then opens it) and the finding's moment.
    pub window_start: u64,
    pub window_end: u64,
    /// Where the collector serves the report: `/api/v1/findings/{finding_id}/report`.
    pub url: String,
    /// The processes whose windows it holds: the finding's own, and for an out-of-memory
    /// failure every other process that held memory then (the device's story).
    pub pids: Vec<u32>,
}

/// The collector's path for the report of finding `finding_id`.
pub fn report_url(finding_id: &str) -> String {
    format!("/api/v1/findings/{finding_id}/report")
}
