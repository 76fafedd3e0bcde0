//! Splitting what is to be sent into requests of at most a given encoded size, keeping each item
//! under its own resource and scope. Sizes are computed with protobuf's own length rules
//! (`encoded_len`), so a request's bytes on the wire are known before it is built.

use prost::Message;

use crate::proto::common::v1::InstrumentationScope;
use crate::proto::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use crate::proto::metrics::v1::{metric, Metric, ResourceMetrics, ScopeMetrics};
use crate::proto::resource::v1::Resource;
use crate::proto::trace::v1::{ResourceSpans, ScopeSpans, Span};

/// Per scope of a group: the scope and its items.
type Scopes<I> = Vec<(Option<InstrumentationScope>, Vec<I>)>;

/// A signal's top-level group (a resource and its scopes' items).
pub(crate) trait Envelope: Message + Sized {
    type Item: Message;
    /// Takes the groups apart: the resource, then per scope its scope and items.
    fn into_parts(self) -> (Option<Resource>, Scopes<Self::Item>);
    fn from_parts(resource: Option<Resource>, scopes: Scopes<Self::Item>) -> Self;
    /// What one item counts for (a metric counts its data points).
    fn items_in(item: &Self::Item) -> u64;
}

impl Envelope for ResourceLogs {
    type Item = LogRecord;

    fn into_parts(self) -> (Option<Resource>, Scopes<LogRecord>) {
        (self.resource, self.scope_logs.into_iter().map(|s| (s.scope, s.log_records)).collect())
    }

    fn from_parts(resource: Option<Resource>, scopes: Scopes<LogRecord>) -> Self {
        let scope_logs = scopes
            .into_iter()
            .map(|(scope, log_records)| ScopeLogs { scope, log_records, ..Default::default() })
            .collect();
        ResourceLogs { resource, scope_logs, ..Default::default() }
    }

    fn items_in(_: &LogRecord) -> u64 {
        1
    }
}

impl Envelope for ResourceSpans {
    type Item = Span;

    fn into_parts(self) -> (Option<Resource>, Scopes<Span>) {
        (self.resource, self.scope_spans.into_iter().map(|s| (s.scope, s.spans)).collect())
    }

    fn from_parts(resource: Option<Resource>, scopes: Scopes<Span>) -> Self {
        let scope_spans =
            scopes.into_iter().map(|(scope, spans)| ScopeSpans { scope, spans, ..Default::default() }).collect();
        ResourceSpans { resource, scope_spans, ..Default::default() }
    }

    fn items_in(_: &Span) -> u64 {
        1
    }
}

impl Envelope for ResourceMetrics {
    type Item = Metric;

    fn into_parts(self) -> (Option<Resource>, Scopes<Metric>) {
        (self.resource, self.scope_metrics.into_iter().map(|s| (s.scope, s.metrics)).collect())
    }

    fn from_parts(resource: Option<Resource>, scopes: Scopes<Metric>) -> Self {
        let scope_metrics =
            scopes.into_iter().map(|(scope, metrics)| ScopeMetrics { scope, metrics, ..Default::default() }).collect();
        ResourceMetrics { resource, scope_metrics, ..Default::default() }
    }

    fn items_in(metric: &Metric) -> u64 {
        (match &metric.data {
            Some(metric::Data::Gauge(g)) => g.data_points.len(),
            Some(metric::Data::Sum(s)) => s.data_points.len(),
            Some(metric::Data::Histogram(h)) => h.data_points.len(),
            Some(metric::Data::ExponentialHistogram(h)) => h.data_points.len(),
            Some(metric::Data::Summary(s)) => s.data_points.len(),
            None => 0,
        }) as u64
    }
}

pub(crate) struct Split<E> {
    /// (the request's groups, items, encoded bytes)
    pub requests: Vec<(Vec<E>, u64, usize)>,
    /// Items larger than a whole request by themselves.
    pub too_large: u64,
}

/// Bytes a length-delimited field of `len` bytes takes with its tag.
fn field(len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

pub(crate) fn split<E: Envelope>(groups: Vec<E>, limit: usize) -> Split<E> {
    let mut out = Split { requests: Vec::new(), too_large: 0 };
    // The request being filled: finished groups, the group being filled, its items and size.
    let mut done: Vec<E> = Vec::new();
    let mut bytes = 0usize;
    let mut items = 0u64;
    for group in groups {
        let (resource, scopes) = group.into_parts();
        let resource_len = resource.as_ref().map_or(0, |r| field(r.encoded_len()));
        let mut current: Scopes<E::Item> = Vec::new();
        // Bytes the current group adds to the request so far (its own envelope included).
        let mut group_bytes = 0usize;
        for (scope, scope_items) in scopes {
            let scope_len = scope.as_ref().map_or(0, |s| field(s.encoded_len()));
            let mut scope_open = false;
            for item in scope_items {
                let item_len = field(item.encoded_len());
                // What adding this item costs: the item, and its scope and group when they are new here.
                let new_scope = if scope_open { 0 } else { scope_len };
                let new_group = if current.is_empty() { resource_len } else { 0 };
                // A group's and a scope's own length prefixes grow too: count their worst case.
                let envelope = 2 * 6;
                let alone = resource_len + scope_len + item_len + envelope;
                if alone > limit {
                    out.too_large += E::items_in(&item);
                    continue;
                }
                if bytes + group_bytes + new_group + new_scope + item_len + envelope > limit {
                    // The request is full: close it with what the group has so far.
                    if !current.is_empty() {
                        done.push(E::from_parts(resource.clone(), std::mem::take(&mut current)));
                    }
                    if !done.is_empty() {
                        let request = std::mem::take(&mut done);
                        let len = encoded(&request);
                        out.requests.push((request, items, len));
                    }
                    bytes = 0;
                    items = 0;
                    group_bytes = 0;
                    scope_open = false;
                }
                if current.is_empty() {
                    group_bytes += resource_len + envelope;
                }
                if !scope_open {
                    current.push((scope.clone(), Vec::new()));
                    group_bytes += scope_len;
                    scope_open = true;
                }
                group_bytes += item_len;
                items += E::items_in(&item);
                current.last_mut().expect("a scope is open").1.push(item);
            }
        }
        if !current.is_empty() {
            done.push(E::from_parts(resource, current));
        }
        bytes += group_bytes;
    }
    if !done.is_empty() {
        let len = encoded(&done);
        out.requests.push((done, items, len));
    }
    out
}

/// A request's size on the wire: its groups are its only field.
fn encoded<E: Envelope>(groups: &[E]) -> usize {
    groups.iter().map(|g| field(g.encoded_len())).sum()
}
