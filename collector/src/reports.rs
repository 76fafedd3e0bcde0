//! The post-mortems' reports the nodes send (docs/postmortem.md): the HTML page of the last
//! seconds before a finding, gzipped, kept by the finding's id and served by
//! `GET /api/v1/findings/{id}/report`. The pages stay in the database; this index says which are
//! there, how large and from when, so that they stay within a total size cap (the oldest go
//! first) and the findings' retention. A report the node found too large to send is a note of
//! where it is on the node.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// What the collector knows of one report (its page is in the database).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportInfo {
    pub finding_id: String,
    pub node: String,
    pub pid: u32,
    /// When the node sent it (ns since the epoch).
    pub ts: u64,
    /// The page's path on the node.
    pub report: String,
    /// The page's size, and gzipped (0 when it was not sent).
    pub html_bytes: u64,
    pub gzip_bytes: u64,
    /// Why the node did not send the page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omitted: Option<String>,
}

/// Every report kept, by finding id.
#[derive(Debug, Default)]
pub struct Reports {
    by_finding: HashMap<String, ReportInfo>,
    bytes: u64,
}

impl Reports {
    pub fn new(loaded: Vec<ReportInfo>) -> Reports {
        let mut reports = Reports::default();
        for info in loaded {
            reports.add(info);
        }
        reports
    }

    /// Keeps `info` (a report sent again replaces the copy before).
    pub fn add(&mut self, info: ReportInfo) {
        self.bytes += info.gzip_bytes;
        if let Some(before) = self.by_finding.insert(info.finding_id.clone(), info) {
            self.bytes -= before.gzip_bytes;
        }
    }

    pub fn get(&self, finding_id: &str) -> Option<&ReportInfo> {
        self.by_finding.get(finding_id)
    }

    /// Drops reports sent before `horizon`, then the oldest until the rest take at most
    /// `max_bytes`; returns the finding ids of those dropped.
    pub fn prune(&mut self, horizon: u64, max_bytes: u64) -> Vec<String> {
        let mut oldest_first: Vec<(u64, String)> =
            self.by_finding.values().map(|r| (r.ts, r.finding_id.clone())).collect();
        oldest_first.sort();
        let mut dropped = Vec::new();
        for (ts, id) in oldest_first {
            if ts >= horizon && self.bytes <= max_bytes {
                break;
            }
            if let Some(info) = self.by_finding.remove(&id) {
                self.bytes -= info.gzip_bytes;
            }
            dropped.push(id);
        }
        dropped
    }

    /// Bytes of the pages kept (gzipped), and how many reports.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.by_finding.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_finding.is_empty()
    }
}

/// A finding named in an address: its `finding_id` (16 hex digits), or the collector's
/// numeric `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FindingRef {
    FindingId(String),
    Id(u64),
}

impl FindingRef {
    pub fn parse(text: &str) -> Option<FindingRef> {
        if text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            Some(FindingRef::FindingId(text.to_ascii_lowercase()))
        } else {
            text.parse().ok().map(FindingRef::Id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, ts: u64, gzip_bytes: u64) -> ReportInfo {
        ReportInfo {
            finding_id: id.to_string(),
            node: "node-a".to_string(),
            pid: 7,
            ts,
            report: format!("/var/lib/gpuprof/postmortems/{id}.html"),
            html_bytes: gzip_bytes * 5,
            gzip_bytes,
            omitted: None,
        }
    }

    #[test]
    fn reports_past_the_retention_go_then_the_oldest_past_the_cap() {
        let mut reports = Reports::new(vec![info("a", 100, 40), info("b", 200, 30), info("c", 300, 20)]);
        assert_eq!((reports.len(), reports.bytes()), (3, 90));
        // Sent again: the copy replaces the first.
        reports.add(info("b", 210, 35));
        assert_eq!((reports.len(), reports.bytes()), (3, 95));
        assert_eq!(reports.prune(150, 1000), ["a"]);
        assert_eq!(reports.prune(150, 40), ["b"]);
        assert_eq!((reports.len(), reports.bytes(), reports.get("c").map(|r| r.ts)), (1, 20, Some(300)));
        assert!(reports.prune(150, 40).is_empty());
    }

    #[test]
    fn a_finding_is_named_by_its_finding_id_or_the_collectors_number() {
        assert_eq!(FindingRef::parse("5F0C2a9d41e7b3c8"), Some(FindingRef::FindingId("5f0c2a9d41e7b3c8".into())));
        assert_eq!(FindingRef::parse("42"), Some(FindingRef::Id(42)));
        assert_eq!(FindingRef::parse("report"), None);
        assert_eq!(FindingRef::parse("5f0c2a9d41e7b3c"), None);
    }
}
