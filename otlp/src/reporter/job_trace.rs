//! One trace per distributed job: each rank's process is a span of its job's trace
//! (`ids::job_trace_id` of `gpuprof.job.id`), from its first call to its exit (or the end of the
//! capture), with what it held then and its findings as the span's events. Whichever node a rank
//! runs on sends its span, so a trace view shows the job's ranks side by side.

use std::collections::HashMap;

use gpuprof_model::findings::Severity;
use gpuprof_model::otel::{resource, span as attr};
use gpuprof_model::track::ProcessMemory;
use gpuprof_model::Finding;
use opentelemetry_proto::tonic::trace::v1::{span, status, Span, Status};

use crate::ids::{job_trace_id, rank_span_id};
use crate::resource::ProcessIdentity;
use crate::{kv_int, kv_str};

/// The name of a rank's span.
pub const RANK_SPAN: &str = "gpuprof.rank";
/// Events a rank's span keeps (its first findings).
const MAX_EVENTS: usize = 64;

/// The ranks followed, each until its span goes out.
#[derive(Default)]
pub(crate) struct RankSpans {
    open: HashMap<u32, OpenRank>,
}

struct OpenRank {
    job: String,
    rank: u32,
    world_size: Option<u32>,
    start: u64,
    events: Vec<span::Event>,
    leak: bool,
}

impl RankSpans {
    /// A process's identity, once it knows its job and rank: its span opens (at `ts`).
    pub(crate) fn learn(&mut self, pid: u32, identity: &ProcessIdentity, ts: u64) {
        let Some(rank) = identity.rank.filter(|_| !identity.job_id.is_empty()) else { return };
        let open = self.open.entry(pid).or_insert_with(|| OpenRank {
            job: identity.job_id.clone(),
            rank,
            world_size: identity.world_size,
            start: ts,
            events: Vec::new(),
            leak: false,
        });
        open.job.clone_from(&identity.job_id);
        open.rank = rank;
        open.world_size = identity.world_size.or(open.world_size);
    }

    /// A finding about a rank: an event of its span.
    pub(crate) fn finding(&mut self, finding: &Finding) {
        let Some(open) = self.open.get_mut(&finding.pid) else { return };
        open.leak |= finding.severity == Severity::Leak;
        if open.events.len() < MAX_EVENTS {
            let mut attributes = vec![
                kv_str(attr::FINDING_KIND, finding.kind.as_str()),
                kv_str(attr::FINDING_ID, &finding.finding_id),
                kv_str(attr::FINDING_SEVERITY, finding.severity.as_str()),
                kv_int(attr::FINDING_BYTES, finding.bytes as i64),
            ];
            if let Some(user) = &finding.user_frame {
                attributes.push(kv_str(attr::FINDING_USER_FRAME, user.to_string()));
            }
            open.events.push(span::Event {
                time_unix_nano: finding.last_ts,
                name: format!("gpuprof.finding.{}", finding.kind.as_str()),
                attributes,
                dropped_attributes_count: 0,
            });
        }
    }

    /// The rank's span, ended at `ts` holding what `process` (its last instance) held.
    pub(crate) fn end(&mut self, pid: u32, host: &str, process: Option<&ProcessMemory>, ts: u64) -> Option<Span> {
        let open = self.open.remove(&pid)?;
        let trace = job_trace_id(&open.job);
        let (allocated, reserved) = process.map_or((0, 0), |p| {
            p.allocator_totals().values().fold((0, 0), |(a, r), t| (a + t.allocated, r + t.reserved))
        });
        let mut attributes = vec![
            kv_str(resource::JOB_ID, &open.job),
            kv_int(resource::RANK, i64::from(open.rank)),
            kv_int(attr::RANK_ALLOCATED_BYTES, allocated as i64),
            kv_int(attr::RANK_RESERVED_BYTES, reserved as i64),
        ];
        if let Some(world_size) = open.world_size {
            attributes.push(kv_int(resource::WORLD_SIZE, i64::from(world_size)));
        }
        let since = process.map_or(open.start, |p| p.first_ts);
        Some(Span {
            trace_id: trace.to_vec(),
            span_id: rank_span_id(&trace, host, pid, since).to_vec(),
            name: RANK_SPAN.to_string(),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: open.start,
            end_time_unix_nano: ts.max(open.start),
            attributes,
            events: open.events,
            status: Some(match open.leak {
                true => {
                    Status { message: "a leak finding of this rank".into(), code: status::StatusCode::Error as i32 }
                }
                false => Status { message: String::new(), code: status::StatusCode::Unset as i32 },
            }),
            ..Default::default()
        })
    }

    /// Pids whose spans are open (the capture ends: each goes out).
    pub(crate) fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.open.keys().copied().collect();
        pids.sort_unstable();
        pids
    }
}
