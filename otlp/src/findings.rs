//! A finding as a span: it covers the finding's time range, sits in the trace of the process it
//! is about (next to that process's allocation spans), and a leak carries an error status so
//! trace views flag it.

use gpuprof_model::findings::Severity;
use gpuprof_model::otel::span as attr;
use gpuprof_model::Finding;
use opentelemetry_proto::tonic::trace::v1::{span, status, Span, Status};

use crate::ids::{process_trace_id, span_id};
use crate::lifetimes::code_attributes;
use crate::{kv_int, kv_str};

/// `since`: when the process instance the finding is about was first seen; `n`: a number unique
/// among this process's findings.
pub(crate) fn span_of(finding: &Finding, host: &str, n: u64) -> Span {
    let trace = process_trace_id(host, finding.pid, finding.process_since);
    // Far from the allocation spans' numbers, which count up from 1.
    let id = span_id(&trace, u64::MAX - n);
    let mut attributes = vec![
        kv_str(attr::FINDING_KIND, finding.kind.as_str()),
        kv_int(gpuprof_model::otel::resource::PROCESS_PID, i64::from(finding.pid)),
        kv_int(attr::FINDING_BYTES, finding.bytes as i64),
        kv_int(attr::FINDING_COUNT, finding.count as i64),
        kv_str(attr::FINDING_DETAIL, &finding.detail),
        kv_str(attr::FINDING_SEVERITY, finding.severity.as_str()),
        kv_str(attr::FINDING_ID, &finding.finding_id),
    ];
    if let Some(user) = &finding.user_frame {
        attributes.push(kv_str(attr::FINDING_USER_FRAME, format!("{}:{} in {}", user.file, user.line, user.function)));
    }
    if let Some(diagnosis) = finding.diagnosis {
        attributes.push(kv_str(attr::FINDING_DIAGNOSIS, diagnosis.as_str()));
    }
    if let Some(seconds) = finding.seconds_to_full {
        attributes.push(kv_int(attr::FINDING_SECONDS_TO_FULL, seconds.round() as i64));
    }
    if let Some(rank) = finding.rank {
        attributes.push(kv_int(attr::RANK, i64::from(rank)));
    }
    if let Some(peer) = finding.peer_pid {
        attributes.push(kv_int(attr::PEER_PID, i64::from(peer)));
    }
    if let Some(api) = &finding.api {
        attributes.push(kv_str(attr::API, api));
    }
    if let Some(postmortem) = &finding.postmortem {
        // Where a person in a trace view goes for the picture of the minute before it.
        attributes.push(kv_str(attr::POSTMORTEM_URL, &postmortem.url));
        attributes.push(kv_str(attr::POSTMORTEM_REPORT, &postmortem.report));
        attributes.push(kv_str(attr::POSTMORTEM_RECORDING, &postmortem.recording));
    }
    attributes.extend(code_attributes(&finding.stack));
    Span {
        trace_id: trace.to_vec(),
        span_id: id.to_vec(),
        name: format!("gpuprof.finding.{}", finding.kind.as_str()),
        kind: span::SpanKind::Internal as i32,
        start_time_unix_nano: finding.first_ts,
        end_time_unix_nano: finding.last_ts.max(finding.first_ts),
        attributes,
        // Trace views flag errors: a leak is one, a fact is not.
        status: Some(match finding.severity {
            Severity::Leak => Status { message: finding.detail.clone(), code: status::StatusCode::Error as i32 },
            Severity::Info => Status { message: String::new(), code: status::StatusCode::Unset as i32 },
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use gpuprof_model::postmortem::{report_url, Postmortem};
    use gpuprof_model::{Finding, FindingKind};

    use super::*;

    #[test]
    fn a_finding_with_a_post_mortem_says_where_it_is_on_its_span() {
        let mut finding = Finding::new(FindingKind::Oom, 4711, "python3", 1 << 20, 1, 10, 20, &[], "oom".into());
        finding.finding_id = "5f0c2a9d41e7b3c8".into();
        let tags = |span: &Span| -> Vec<(String, String)> {
            span.attributes
                .iter()
                .filter(|a| a.key.starts_with("gpuprof.postmortem."))
                .map(|a| (a.key.clone(), crate::attribute_str(std::slice::from_ref(a), &a.key).unwrap().to_string()))
                .collect()
        };
        assert!(tags(&span_of(&finding, "gpu-1", 1)).is_empty());
        finding.postmortem = Some(Postmortem {
            node: "gpu-1".into(),
            recording: "/pm/gpu-1-4711-python3-oom-20261127-011617.gpuprof".into(),
            report: "/pm/gpu-1-4711-python3-oom-20261127-011617.html".into(),
            window_start: 0,
            window_end: 20,
            url: report_url(&finding.finding_id),
            pids: vec![4711],
        });
        assert_eq!(
            tags(&span_of(&finding, "gpu-1", 1)),
            [
                ("gpuprof.postmortem.url".to_string(), "/api/v1/findings/5f0c2a9d41e7b3c8/report".to_string()),
                (
                    "gpuprof.postmortem.report".to_string(),
                    "/pm/gpu-1-4711-python3-oom-20261127-011617.html".to_string()
                ),
                (
                    "gpuprof.postmortem.recording".to_string(),
                    "/pm/gpu-1-4711-python3-oom-20261127-011617.gpuprof".to_string()
                ),
            ]
        );
    }
}
