#!/usr/bin/env bash
# GPU validation of the node daemon at its defaults (the driver's level, raising what grows),
# with gpuprof-collector behind it: PyTorch jobs started on their own, each a problem real jobs
# have or none, and what the collector says of each (tests/gpu/summarize_always_on.py):
#   why_healthy.py      training with evaluation under no_grad        no leak
#   why_list_keep.py    each step's output kept in a list             one growth, at its line
#   why_loss_sum.py     validation losses summed as tensors           one growth, retained graph
#   torch_dataloader.py a DataLoader whose dataset uses CUDA          a worker_cuda_context a worker
#   torch_stories.py orphans  workers of a launcher killed with SIGKILL  an orphan finding each
#   oom_fragment.py     fills the card in pieces, then asks for 8 GiB   one oom (fragmentation) and
#                       its post-mortem, whose tables must match torch.cuda.memory_stats()
# The first five run at once for ~75 s (the daemon's growth windows are 10 s: two to raise a job,
# three more for its tensors); the OOM runs alone after them (it fills the device). Then the
# daemon's cost to a training step, measured inside one process with the daemon started and
# stopped in alternate windows (bench/overhead.py --capture daemon).
#
#   GPUPROF_BIN=… COLLECTOR_BIN=… OUT=/tmp/out tests/gpu/validate_always_on.sh
source "$(dirname "$0")/env.sh"
collector=${COLLECTOR_BIN:?set COLLECTOR_BIN to the gpuprof-collector binary}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
work=/tmp/gpuprof-always-on
rm -rf "$work" && mkdir -p "$work"
{
  echo "== machine"
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv,noheader
  "$collector" --db "$work/collector.redb" > "$work/collector.log" 2>&1 &
  cpid=$!
  "$bin" daemon --otlp-endpoint http://127.0.0.1:4317 --listen 127.0.0.1:9464 --node-name gpu-node \
    --postmortem-dir "$work/postmortems" > "$work/daemon.stderr" 2>&1 &
  dpid=$!
  until curl -sf 127.0.0.1:9464/readyz > /dev/null; do sleep 0.1; done
  echo "daemon ready: $(head -c 300 "$work/daemon.stderr")"
  ( while :; do
      echo "$(date +%s): $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ';')"
      sleep 3
    done ) > "$work/nvidia-smi.txt" 2>&1 &
  sampler=$!
  echo "== five jobs at once"
  "$py" "$here/why_healthy.py" 75 > "$work/healthy.facts" 2> "$work/healthy.err" &
  j1=$!
  "$py" "$here/why_list_keep.py" 75 > "$work/list_keep.facts" 2> "$work/list_keep.err" &
  j2=$!
  "$py" "$here/why_loss_sum.py" 75 > "$work/loss_sum.facts" 2> "$work/loss_sum.err" &
  j3=$!
  "$py" "$here/torch_dataloader.py" > "$work/dataloader.facts" 2> "$work/dataloader.err" &
  j4=$!
  "$py" "$here/torch_stories.py" orphans > "$work/orphans.facts" 2> "$work/orphans.err" &
  j5=$!
  wait $j1 $j2 $j3 $j4
  echo "jobs exited: $?"
  wait $j5
  # The orphans live on for 20 s after their launcher's end.
  sleep 25
  echo "== out of memory, alone"
  "$py" "$here/oom_fragment.py" 20 > "$work/oom.facts" 2> "$work/oom.err"
  echo "oom_fragment exit $?"
  sleep 8
  kill $sampler
  curl -s 127.0.0.1:9464/metrics > "$work/daemon.metrics.txt"
  curl -s 127.0.0.1:4318/api/v1/findings > "$work/findings.json"
  curl -s 127.0.0.1:4318/metrics > "$work/collector.metrics.txt"
  oom_id=$("$py" -c 'import json,sys; print(next((f["finding_id"] for f in json.load(open(sys.argv[1])) if f["kind"] == "oom"), ""))' "$work/findings.json")
  curl -s -o "$work/oom-report.html" -w "report of $oom_id from the collector: %{http_code} %{size_download} bytes\n" \
    "127.0.0.1:4318/api/v1/findings/$oom_id/report"
  kill -TERM $dpid; wait $dpid; echo "daemon exit $?"
  kill -TERM $cpid; wait $cpid; echo "collector exit $?"
  grep -E "capturing tensors|back to driver|finding|post-mortem|warning" "$work/daemon.stderr" | cut -c1-400
  grep -v '^#' "$work/daemon.metrics.txt" | grep -E "lost|raises|postmortem|findings|events_total"
  ls -la "$work/postmortems"
  # The out-of-memory's post-mortem as readable events (the growths' raised windows are large).
  for recording in "$work"/postmortems/*-oom-*.gpuprof; do
    "$bin" export "$recording" -f jsonl -o "${recording%.gpuprof}.jsonl"
  done
  "$py" "$here/summarize_always_on.py" "$work"
  echo "== the daemon's cost to a training step, in one process"
  timeout 300 "$py" "$here/../../bench/overhead.py" --gpuprof "$bin" --collector "$collector" --workload encoder \
    --capture daemon --windows 20 --window 5 --json "$work/overhead.json" 2>&1 | tail -25
} > "$out/always_on.log" 2>&1
# What comes back: the small files and the out-of-memory's post-mortem, in one archive.
(cd "$work" && tar czf "$out/always_on.tgz" ./*.facts ./*.err ./*.json ./*.txt ./*.stderr ./*.log ./*.html \
  postmortems/*-oom-* 2> /dev/null)
cat "$out/always_on.log"
