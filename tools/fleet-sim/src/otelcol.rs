//! What the OpenTelemetry Collector in front of the shards gave up, read from its log: its
//! per-shard exporters inside `load_balancing` report nothing to its own metrics (their meter
//! is a no-op), so a batch dropped after its retries, or refused by a full queue, is known only
//! by the line the Collector writes for it.

/// Items and batches the Collector said it dropped.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GivenUp {
    /// Items of batches an exporter dropped (`Exporting failed. Dropping data.`, `dropped_items`).
    pub items: u64,
    /// Batches the batch processor could not hand on (`Sender failed`: a full queue or a refusal
    /// before any queue); their items are not said.
    pub batches_unsized: u64,
    /// The first few such lines, as written.
    pub lines: Vec<String>,
}

const LINES_KEPT: usize = 3;

/// What the Collector's log `text` says it gave up.
pub fn given_up(text: &str) -> GivenUp {
    let mut given_up = GivenUp::default();
    for line in text.lines() {
        if line.contains("Dropping data") {
            given_up.items += dropped_items(line).unwrap_or(0);
        } else if line.contains("Sender failed") {
            given_up.batches_unsized += 1;
        } else {
            continue;
        }
        if given_up.lines.len() < LINES_KEPT {
            given_up.lines.push(line.to_string());
        }
    }
    given_up
}

/// The `"dropped_items": N` of a log line's fields.
fn dropped_items(line: &str) -> Option<u64> {
    let after = line.split("\"dropped_items\":").nth(1)?;
    let digits: String = after.trim_start().chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    // As v0.161.0 writes them (console encoding): the first from a Collector whose shard was away
    // past its retry.
    const DROPPED: &str = "2026-11-29T23:04:56.627Z\terror\tinternal/queue_sender.go:62\tExporting failed. Dropping data.\t{\"resource\": {\"service.instance.id\": \"86a721a9-7825-43ae-8e02-a8f440d443db\", \"service.name\": \"gpuprof-otelcol\", \"service.version\": \"0.161.0\"}, \"otelcol.component.id\": \"load_balancing\", \"otelcol.component.kind\": \"exporter\", \"otelcol.signal\": \"logs\", \"endpoint\": \"127.0.0.1:1\", \"error\": \"no more retries left: rpc error: code = Unavailable desc = connection error: desc = \\\"transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused\\\"\", \"dropped_items\": 117}";
    const SENDER: &str = "2026-11-29T23:01:02.346Z\twarn\tbatchprocessor@v0.161.0/batch_processor.go:272\tSender failed\t{\"resource\": {}, \"otelcol.component.id\": \"batch\", \"otelcol.component.kind\": \"processor\", \"otelcol.pipeline.id\": \"logs\", \"otelcol.signal\": \"logs\", \"error\": \"sending queue is full\"}";

    #[test]
    fn dropped_items_and_unsized_batches_are_summed_and_the_first_lines_kept() {
        let log = format!("2026-11-29T23:00:00.000Z\tinfo\tservice@v0.161.0/service.go:1\tEverything is ready.\n{DROPPED}\n{SENDER}\n{DROPPED}\n{DROPPED}\n");
        let given_up = given_up(&log);
        assert_eq!(given_up.items, 3 * 117);
        assert_eq!(given_up.batches_unsized, 1);
        assert_eq!(given_up.lines, vec![DROPPED, SENDER, DROPPED]);
    }

    #[test]
    fn a_log_that_gave_up_nothing_says_nothing() {
        assert_eq!(
            given_up("2026-11-29T23:00:00.000Z\tinfo\tservice.go:1\tEverything is ready.\n"),
            GivenUp::default()
        );
    }
}
