use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;

use super::split::split;
use super::*;
use crate::proto::common::v1::{any_value, AnyValue};
use crate::proto::logs::v1::{LogRecord, ScopeLogs};
use crate::resource::ProcessIdentity;

fn record(n: usize, body_bytes: usize) -> LogRecord {
    LogRecord {
        time_unix_nano: n as u64,
        body: Some(AnyValue { value: Some(any_value::Value::StringValue("x".repeat(body_bytes))) }),
        ..Default::default()
    }
}

fn logs(pid: u32, records: Vec<LogRecord>) -> ResourceLogs {
    let identity =
        ProcessIdentity { host_name: "node-a".into(), pid, executable: "python3".into(), ..Default::default() };
    ResourceLogs {
        resource: Some(identity.resource()),
        scope_logs: vec![ScopeLogs { scope: Some(crate::scope()), log_records: records, ..Default::default() }],
        ..Default::default()
    }
}

#[test]
fn requests_stay_under_the_limit_and_keep_every_item_under_its_resource() {
    let limit = 64 * 1024;
    let groups = vec![
        logs(1, (0..300).map(|n| record(n, 700)).collect()),
        logs(2, (300..310).map(|n| record(n, 100)).collect()),
        logs(3, vec![record(310, 80_000), record(311, 10)]),
    ];
    let result = split(groups, limit);
    assert_eq!(result.too_large, 1);
    let mut seen: Vec<(u32, u64)> = Vec::new();
    for (request, items, bytes) in &result.requests {
        let encoded = ExportLogsServiceRequest { resource_logs: request.clone() }.encode_to_vec().len();
        assert_eq!(encoded, *bytes);
        assert!(encoded <= limit, "a request of {encoded} bytes");
        let mut count = 0;
        for group in request {
            let pid = ProcessIdentity::of_resource(group.resource.as_ref().unwrap()).pid;
            for record in group.scope_logs.iter().flat_map(|s| &s.log_records) {
                seen.push((pid, record.time_unix_nano));
                count += 1;
            }
        }
        assert_eq!(count, *items);
    }
    let expected: Vec<(u32, u64)> =
        (0..300).map(|n| (1, n)).chain((300..310).map(|n| (2, n))).chain(std::iter::once((3, 311))).collect();
    assert_eq!(seen, expected);
    assert!(result.requests.len() >= 4, "{} requests", result.requests.len());
}

/// A minimal OTLP/HTTP receiver: answers `unavailable` (503) to the first requests it is told
/// to, then takes everything, decoding each request's log records.
struct Receiver {
    address: String,
    records: Arc<Mutex<Vec<u64>>>,
    requests: Arc<Mutex<Vec<usize>>>,
}

impl Receiver {
    fn start(refuse_first: usize) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let records = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (r, q) = (records.clone(), requests.clone());
        std::thread::spawn(move || {
            let mut refused = 0;
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                serve(stream, &r, &q, &mut refused, refuse_first);
            }
        });
        Receiver { address, records, requests }
    }
}

fn serve(
    stream: TcpStream,
    records: &Mutex<Vec<u64>>,
    requests: &Mutex<Vec<usize>>,
    refused: &mut usize,
    refuse_first: usize,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            if line.trim().is_empty() {
                break;
            }
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        if *refused < refuse_first {
            *refused += 1;
            writer.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n").unwrap();
            continue;
        }
        let request = ExportLogsServiceRequest::decode(&body[..]).unwrap();
        requests.lock().unwrap().push(body.len());
        let mut seen = records.lock().unwrap();
        for group in request.resource_logs {
            for record in group.scope_logs.into_iter().flat_map(|s| s.log_records) {
                seen.push(record.time_unix_nano);
            }
        }
        writer
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
            .unwrap();
    }
}

#[test]
fn a_receiver_that_is_away_at_first_gets_everything_in_order_under_the_limit() {
    let receiver = Receiver::start(3);
    let mut options = ClientOptions::new(&receiver.address, Protocol::Http);
    options.max_request_bytes = 32 * 1024;
    let client = Client::start(options, "test-otlp").unwrap();
    for batch in 0..20 {
        client.logs(vec![logs(7, (batch * 100..batch * 100 + 100).map(|n| record(n, 300)).collect())]);
    }
    let delivery = client.finish(Duration::from_secs(20));
    assert_eq!((delivery.sent_records, delivery.lost(), delivery.pending), (2000, 0, 0), "{delivery}");
    assert_eq!(*receiver.records.lock().unwrap(), (0..2000).collect::<Vec<u64>>());
    let sizes = receiver.requests.lock().unwrap().clone();
    assert!(sizes.iter().all(|&s| s <= 32 * 1024), "{sizes:?}");
    assert_eq!(delivery.requests, sizes.len() as u64);
    assert_eq!(delivery.bytes_sent, sizes.iter().sum::<usize>() as u64);
    assert_eq!(delivery.last_error.as_deref(), Some(&*format!("POST {}/v1/logs: HTTP 503", receiver.address)));
}

#[test]
fn a_full_queue_gives_up_gauges_first_and_counts_what_it_refuses() {
    // Nothing listens there: the sender retries the first batch while the queue fills.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let mut options = ClientOptions::new(&address, Protocol::Http);
    options.queue_bytes = 16 * 1024;
    options.max_request_bytes = 4 * 1024;
    let client = Client::start(options, "test-otlp").unwrap();
    let gauge = |value: i64| {
        use crate::proto::metrics::v1::{metric, Gauge, NumberDataPoint};
        let point = NumberDataPoint {
            value: Some(crate::proto::metrics::v1::number_data_point::Value::AsInt(value)),
            ..Default::default()
        };
        let metric = Metric {
            name: "g".into(),
            data: Some(metric::Data::Gauge(Gauge { data_points: vec![point; 100] })),
            ..Default::default()
        };
        ResourceMetrics {
            scope_metrics: vec![ScopeMetrics { metrics: vec![metric], ..Default::default() }],
            ..Default::default()
        }
    };
    for value in 0..20 {
        client.metrics(vec![gauge(value)]);
    }
    let queued_gauges = client.queued_bytes();
    assert!(queued_gauges <= 16 * 1024);
    // Log records push the gauges out before any record is refused.
    for n in 0..10 {
        client.logs(vec![logs(7, vec![record(n, 1000)])]);
    }
    let delivery = client.delivery();
    assert!(delivery.dropped_queue_full >= 1000, "{delivery}");
    assert_eq!(delivery.dropped_queue_full % 100, 0, "whole gauge batches only: {delivery}");
    let delivery = client.finish(Duration::from_millis(300));
    assert_eq!(delivery.sent(), 0);
    assert_eq!(delivery.lost(), 20 * 100 + 10, "{delivery}");
}

use crate::proto::metrics::v1::{Metric, ScopeMetrics};

/// A gRPC receiver killed with the request on the wire (it read it, then its connection closed
/// with no answer): the request may or may not have been taken, so it is sent again — delivery
/// is at least once, and collectors keep a finding once by its id — not dropped as refused.
#[test]
fn a_grpc_request_cut_off_by_its_receivers_death_is_retried() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        // The preface, SETTINGS, HEADERS and DATA: the whole request, then no answer.
        let mut taken = Vec::new();
        let mut buffer = [0u8; 64 * 1024];
        while let Ok(n) = stream.read(&mut buffer) {
            if n == 0 {
                break;
            }
            taken.extend_from_slice(&buffer[..n]);
        }
        taken.len()
    });
    let mut transport = transport::Transport::new(&address, Protocol::Grpc, None).unwrap();
    let request = transport::Request::Logs(crate::proto::collector::logs::v1::ExportLogsServiceRequest {
        resource_logs: vec![logs(7, vec![record(1, 2000)])],
    });
    let error = transport.send(&request).unwrap_err();
    assert!(server.join().unwrap() > 2000, "the receiver did not read the request");
    assert!(matches!(error, transport::SendError::Retryable(_)), "{error}");
    assert!(error.to_string().starts_with("gRPC Unknown: transport error: "), "{error}");
}
