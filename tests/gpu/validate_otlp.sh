#!/usr/bin/env bash
# GPU validation of OTLP export: a PyTorch job under `gpuprof run --otlp-endpoint`, sending to
# gpuprof-collector on loopback; the collector must end with what the agent itself saw: every
# event, one span per allocation, the same findings, the same allocator totals.
#
#   GPUPROF_BIN=path/to/gpuprof COLLECTOR_BIN=path/to/gpuprof-collector OUT=/tmp/out tests/gpu/validate_otlp.sh
source "$(dirname "$0")/env.sh"
collector=${COLLECTOR_BIN:?set COLLECTOR_BIN to the gpuprof-collector binary}
{
  "$collector" --db "$out/collector.redb" > "$out/collector.log" 2>&1 &
  cpid=$!
  sleep 1
  "$bin" run --output "$out/otlp.jsonl" --findings "$out/otlp.findings.json" --otlp-endpoint http://127.0.0.1:4317 \
    -- "$py" "$here/torch_allocator.py" > "$out/otlp.facts.json"
  echo "exit $?"
  curl -s 127.0.0.1:4318/api/v1/findings > "$out/collector.findings.json"
  curl -s 127.0.0.1:4318/api/v1/processes > "$out/collector.processes.json"
  curl -s 127.0.0.1:4318/metrics > "$out/collector.metrics.txt"
  kill -TERM $cpid; wait $cpid; echo "collector exit $?"
  "$py" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
events = [json.loads(l) for l in open(f"{out}/otlp.jsonl")]
allocs = sum(1 for e in events if e["op"] == "alloc" and e.get("result", 0) == 0 and e.get("addr") and e.get("kind") and e["layer"] in ("driver", "allocator"))
metrics = {l.split(" ")[0]: float(l.split(" ")[1]) for l in open(f"{out}/collector.metrics.txt") if l and not l.startswith("#")}
print("log records: agent", len(events), "collector", int(metrics['gpuprof_collector_received_total{signal="log_records"}']))
print("spans: allocations", allocs, "collector", int(metrics['gpuprof_collector_received_total{signal="spans"}']))
agent = json.load(open(f"{out}/otlp.findings.json"))
collected = [{k: v for k, v in f.items() if k not in ("id", "node", "process_since")} for f in json.load(open(f"{out}/collector.findings.json"))]
print("findings equal:", agent == collected, [f["kind"] for f in collected])
facts = json.load(open(f"{out}/otlp.facts.json"))
last = [e for e in events if e["pid"] == facts["pid"] and "allocated" in e][-1]
proc = [p for p in json.load(open(f"{out}/collector.processes.json")) if p["pid"] == facts["pid"]][-1]
print("allocator totals at the end: agent", last["allocated"], last["reserved"], "collector", proc["allocator"])
PY
} > "$out/otlp.log" 2>&1
cat "$out/otlp.log"
