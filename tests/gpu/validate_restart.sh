#!/usr/bin/env bash
# GPU validation of a node daemon killed (SIGKILL) and started again under two running PyTorch
# jobs (docs/reliability.md, the fault matrix): the second daemon says for each job that what it
# allocated before is not known, and still finds each job's growth at its line; the jobs' own
# counters and NVML beside it.
#
#   GPUPROF_BIN=path/to/gpuprof OUT=/tmp/out tests/gpu/validate_restart.sh
source "$(dirname "$0")/env.sh"
{
  "$bin" daemon --output "$out/restart-1.jsonl" --listen 127.0.0.1:9464 --node-name gpu-node > "$out/restart-1.stderr" 2>&1 &
  first=$!
  until curl -sf 127.0.0.1:9464/readyz > /dev/null; do sleep 0.05; done
  "$py" "$here/torch_leak_job.py" 50 > "$out/restart.job1.json" &
  job1=$!
  "$py" "$here/torch_leak_job.py" 50 > "$out/restart.job2.json" &
  job2=$!
  sleep 12
  kill -KILL "$first"; wait "$first"; echo "first daemon killed: exit $?"
  "$bin" daemon --output "$out/restart-2.jsonl" --listen 127.0.0.1:9465 --node-name gpu-node > "$out/restart-2.stderr" 2>&1 &
  second=$!
  until curl -sf 127.0.0.1:9465/readyz > /dev/null; do sleep 0.05; done
  echo "NVML after the restart:"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
  wait "$job1" "$job2"
  sleep 2
  kill -TERM "$second"; wait "$second"; echo "second daemon exit $?"
  echo "the jobs:"; cat "$out/restart.job1.json" "$out/restart.job2.json"
  echo "the second daemon:"
  grep -E "already using CUDA|finding growth|daemon on node" "$out/restart-2.stderr" | cut -c1-400
} > "$out/restart.log" 2>&1
cat "$out/restart.log"
