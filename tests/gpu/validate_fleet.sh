#!/usr/bin/env bash
# GPU validation of the fleet path at training rates: `gpuprof daemon` (eBPF, the node agent)
# sending to gpuprof-collector, four training processes at once (the benchmark's loop, ~470
# allocator allocations a step; the first keeps an activation every 50 steps). Checks: nothing
# lost, no request refused, the daemon under its memory cap, each process's allocator totals at
# the collector equal to its own torch.cuda.memory_stats() (taken while it holds its memory),
# NVML's per-process memory beside them, each process's trace at most 2,000 spans, and a memory
# profile fetched as pprof.
#
#   GPUPROF_BIN=… COLLECTOR_BIN=… OUT=… [RUN_SECONDS=60] tests/gpu/validate_fleet.sh
source "$(dirname "$0")/env.sh"
collector=${COLLECTOR_BIN:?set COLLECTOR_BIN to the gpuprof-collector binary}
seconds=${RUN_SECONDS:-60}
train=${TRAIN:-"$py $here/train_fleet.py"}
work=${WORK:-/tmp/gpuval}
mkdir -p "$work"
{
  "$collector" --db "$work/fleet.redb" --max-request-mib 4 > "$work/fleet-collector.log" 2>&1 &
  cpid=$!
  "$bin" daemon --otlp-endpoint http://127.0.0.1:4317 --node-name h100-node --listen 127.0.0.1:9464 \
    --memory-cap-mib 256 > "$work/fleet-daemon.stderr" 2>&1 &
  dpid=$!
  until curl -sf 127.0.0.1:9464/readyz > /dev/null; do sleep 0.05; done
  echo "daemon ready"
  pids=()
  for i in 0 1 2 3; do
    keep=0; [ "$i" = 0 ] && keep=50
    $train --seconds "$seconds" --stats "$work/fleet.stats.$i.json" --keep-every "$keep" --hold 8 > "$work/fleet.train.$i.log" 2>&1 &
    pids+=($!)
  done
  # The daemon's resident memory, each second, while the jobs run.
  ( while kill -0 "$dpid" 2>/dev/null; do
      echo "$(date +%s) $(grep VmRSS /proc/$dpid/status | awk '{print $2}') $(curl -s 127.0.0.1:9464/metrics | grep -E '^gpuprof_daemon_(events_total|otlp_queued_bytes|otlp_sent_items_total|otlp_lost_items_total) ' | tr '\n' ' ')"
      sleep 1
    done ) > "$work/fleet.rss.txt" 2>&1 &
  until [ -f "$work/fleet.stats.0.json" ] && [ -f "$work/fleet.stats.1.json" ] && [ -f "$work/fleet.stats.2.json" ] && [ -f "$work/fleet.stats.3.json" ]; do sleep 0.2; done
  # Each job now holds its memory, idle: two gauge intervals later the collector has its totals.
  sleep 3
  curl -s 127.0.0.1:4318/api/v1/processes?node=h100-node > "$work/fleet.processes.json"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$work/fleet.nvml.csv"
  first=$(python3 -c "import json; print(json.load(open('$work/fleet.stats.0.json'))['pid'])")
  curl -s "127.0.0.1:4318/api/v1/profile?node=h100-node&pid=$first" > "$work/fleet.profile.pb"
  wait "${pids[@]}"
  sleep 3
  curl -s 127.0.0.1:9464/metrics > "$work/fleet-daemon.metrics.txt"
  grep VmHWM /proc/$dpid/status > "$work/fleet-daemon.peak.txt"
  kill -TERM $dpid; wait $dpid; echo "daemon exit $?"
  # After the daemon's last flush: what the collector has of it all.
  curl -s 127.0.0.1:4318/metrics > "$work/fleet-collector.metrics.txt"
  curl -s 127.0.0.1:4318/api/v1/findings?node=h100-node > "$work/fleet.findings.json"
  curl -s 127.0.0.1:4318/api/v1/processes?node=h100-node > "$work/fleet.processes.end.json"
  kill -TERM $cpid; wait $cpid; echo "collector exit $?"
  tail -3 "$work/fleet-daemon.stderr"
  python3 "$here/compare_fleet.py" "$work"
  echo "compare exit $?"
} > "$work/fleet.log" 2>&1
cat "$work/fleet.log"
cp "$work/fleet.profile.pb" "$out/" 2>/dev/null
fleet=(); for file in "$work"/fleet*; do fleet+=("${file##*/}"); done
tar czf "$out/fleet.tgz" -C "$work" --exclude='*.redb' --exclude='*.gpuprof' "${fleet[@]}"
