#!/usr/bin/env bash
# GPU validation of `gpuprof daemon`: PyTorch jobs started on their own (the daemon is told
# nothing about them) are found, captured and sent to gpuprof-collector. Each job's allocator
# events must equal its own memory_stats() counters and memory_allocated()/memory_reserved()
# curves; the first job is a cold start (its libc10 not yet probed when it starts). At the tensors
# level: the daemon records the driver's calls only by default (docs/levels.md).
#
#   GPUPROF_BIN=path/to/gpuprof COLLECTOR_BIN=path/to/gpuprof-collector OUT=/tmp/out tests/gpu/validate_daemon.sh
source "$(dirname "$0")/env.sh"
collector=${COLLECTOR_BIN:?set COLLECTOR_BIN to the gpuprof-collector binary}
{
  "$collector" --db "$out/daemon-collector.redb" > "$out/daemon-collector.log" 2>&1 &
  cpid=$!
  "$bin" daemon --level tensors --otlp-endpoint http://127.0.0.1:4317 --output "$out/daemon.jsonl" --listen 127.0.0.1:9464 \
    --node-name gpu-node > "$out/daemon.stderr" 2>&1 &
  dpid=$!
  started=$(date +%s%N)
  until curl -sf 127.0.0.1:9464/readyz > /dev/null; do sleep 0.05; done
  echo "daemon ready after $(( ($(date +%s%N) - started) / 1000000 )) ms"
  "$py" "$here/torch_allocator.py" > "$out/daemon.facts.0.json"
  "$py" "$here/torch_allocator.py" > "$out/daemon.facts.1.json" &
  first=$!
  "$py" "$here/torch_allocator.py" > "$out/daemon.facts.2.json" &
  second=$!
  wait $first $second
  sleep 2.5
  curl -s 127.0.0.1:9464/metrics > "$out/daemon.metrics.txt"
  curl -s 127.0.0.1:4318/api/v1/processes > "$out/daemon-collector.processes.json"
  curl -s 127.0.0.1:4318/metrics > "$out/daemon-collector.metrics.txt"
  kill -TERM $dpid; wait $dpid; echo "daemon exit $?"
  kill -TERM $cpid; wait $cpid; echo "collector exit $?"
  grep -v '^#' "$out/daemon.metrics.txt"
  "$py" "$here/compare_allocator.py" "$out/daemon.jsonl" "$out"/daemon.facts.*.json
  echo "compare exit $?"
  "$py" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
events = [json.loads(l) for l in open(f"{out}/daemon.jsonl")]
processes = json.load(open(f"{out}/daemon-collector.processes.json"))
metrics = {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in open(f"{out}/daemon-collector.metrics.txt") if l.strip() and not l.startswith("#")}
print("log records: daemon", len(events), "collector", int(metrics['gpuprof_collector_received_total{signal="log_records"}']))
for i in range(3):
    facts = json.load(open(f"{out}/daemon.facts.{i}.json"))
    last = [e for e in events if e["pid"] == facts["pid"] and "allocated" in e][-1]
    proc = [p for p in processes if p["pid"] == facts["pid"]][-1]
    print(f"pid {facts['pid']}: allocator totals at the end: daemon {last['allocated']} {last['reserved']}, collector {proc['allocator']}")
PY
} > "$out/daemon.log" 2>&1
cat "$out/daemon.log"
