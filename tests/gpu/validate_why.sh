#!/usr/bin/env bash
# GPU validation of findings that say why (run on a machine with an NVIDIA GPU and PyTorch):
# `gpuprof run` at its defaults on short jobs, each ~7 s of steps, and what their findings say
# beside what each job prints of itself (pid, torch.cuda.memory_stats(), its expected lines):
#   why_loss_sum   validation losses summed as tensors        growth, autograd_graph_retained
#   why_list_keep  each step's output kept in a list           growth, tensors_kept_by_user_code
#   why_healthy    training with evaluation under no_grad     no leak
#   why_ddp        two DDP ranks, rank 1 keeps 4 MiB a step    growth of rank 1 (skipped on 1 GPU)
#   why_eval       evaluation without no_grad beside a         growth, autograd_graph_retained,
#                  neighbour caching 20 GiB, until OOM         then one oom, neighbour_cache
# The first four run at once; the evaluation alone after them (it fills the device). nvidia-smi
# is sampled meanwhile. About 75 s in all; the time limits of its parts stop it by ~165 s.
# Leaves in $OUT: why.log (everything), why_findings.json, why_facts.json, and the jsonl
# compressed (why_events.tar when under 15 MiB, else why_eval.jsonl.gz when it is).
#
#   GPUPROF_BIN=path/to/gpuprof OUT=/tmp/out tests/gpu/validate_why.sh
source "$(dirname "$0")/env.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
work=$(mktemp -d)
t0=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# NAME LIMIT COMMAND…: the command under `gpuprof run` at its default rules; its stdout (the
# job's facts) and stderr (gpuprof's and the job's) kept apart.
job() {
  local name=$1 limit=$2 start
  shift 2
  start=$(date +%s.%N)
  echo "$name: started at t+$(since "$t0") s"
  timeout -k 5 -s INT "$limit" "$bin" run --output "$out/$name.jsonl" --findings "$work/$name.live.json" \
    -- "$@" > "$work/$name.facts" 2> "$work/$name.stderr"
  echo "$name: gpuprof run exit $? after $(since "$start") s (at t+$(since "$t0") s)"
}

# NAME: the findings of its jsonl, at the defaults and, for reference, at 1 s windows.
reports() {
  timeout 15 "$bin" report "$out/$1.jsonl" -f json > "$work/$1.report.json" 2> "$work/$1.report.err"
  timeout 15 "$bin" report "$out/$1.jsonl" -f json --growth-window 1 > "$work/$1.w1.json" 2>> "$work/$1.report.err"
}

{
  echo "== machine"
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv,noheader
  gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
  "$bin" --version
  "$bin" run --help | grep -A3 -E -- "--growth-(window|rises)" | grep -E -- "--growth|default"
  ( while :; do
      echo "t+$(since "$t0") s: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ';')"
      sleep 3
    done ) > "$work/nvidia-smi.txt" 2>&1 &
  sampler=$!

  echo "== 1-4. the training jobs at once"
  names="why_loss_sum why_list_keep why_healthy"
  job why_loss_sum 45 "$py" "$here/why_loss_sum.py" 7 & running=$!
  job why_list_keep 45 "$py" "$here/why_list_keep.py" 7 & running="$running $!"
  job why_healthy 45 "$py" "$here/why_healthy.py" 7 & running="$running $!"
  if [ "$gpus" -ge 2 ]; then
    names="$names why_ddp"
    job why_ddp 45 "$py" -m torch.distributed.run --standalone --nproc_per_node 2 "$here/why_ddp.py" 7 &
    running="$running $!"
  else
    echo "why_ddp: skipped: nvidia-smi lists $gpus GPU (torch.cuda.device_count() < 2); the DDP job needs 2"
  fi
  # shellcheck disable=SC2086 # a list of pids
  wait $running
  ( for name in $names; do reports "$name"; done ) &
  reporting=$!

  echo "== 5. the evaluation that runs out of memory beside a neighbour's cache"
  job why_eval 65 "$py" "$here/why_eval_oom.py" 20 18
  kill "$sampler" 2> /dev/null
  reports why_eval
  wait "$reporting"
  names="$names why_eval"
  echo "all jobs and reports done at t+$(since "$t0") s"

  echo "== nvidia-smi while the jobs ran (pid, used_memory)"
  cat "$work/nvidia-smi.txt"
  for name in $names; do
    echo
    echo "==== $name"
    echo "-- gpuprof's lines"
    grep '^gpuprof' "$work/$name.stderr" | cut -c1-300 | head -15
    echo "-- the job's stderr (last lines before gpuprof's findings)"
    grep -v '^gpuprof' "$work/$name.stderr" | sed -n '/^Findings/q;p' | grep -v '^$' | tail -15 | cut -c1-300
    head -5 "$work/$name.report.err" 2> /dev/null
    "$py" "$here/why_check.py" show "$name" "$work" > "$work/$name.shown" 2>&1
    cat "$work/$name.shown"
    echo "-- jsonl: $(wc -l < "$out/$name.jsonl" 2> /dev/null) events, $(du -h "$out/$name.jsonl" 2> /dev/null | cut -f1)"
  done

  echo
  echo "== gpuprof report why_eval.jsonl -f table"
  timeout 15 "$bin" report "$out/why_eval.jsonl" -f table
  echo "== the HTML report of why_eval.jsonl: its findings' diagnoses"
  timeout 30 "$bin" export -f html -o "$work/why_eval.html" "$out/why_eval.jsonl" 2>&1 | tail -1
  grep -o '"diagnosis":"[a-z_]*"' "$work/why_eval.html" | sort | uniq -c

  # shellcheck disable=SC2086 # a list of names
  "$py" "$here/why_check.py" collect "$work" "$out" $names
  echo
  echo "== summary"
  for name in $names; do grep '^CHECK' "$work/$name.shown"; done
  echo "done at t+$(since "$t0") s"
} > "$out/why.log" 2>&1

# What comes back is a few files: the jsonl go compressed, together when they are small enough.
shopt -s nullglob
gzip -f "$out"/why_*.jsonl
(cd "$out" && tar -cf why_events.tar why_*.jsonl.gz)
if [ "$(stat -c %s "$out/why_events.tar" 2> /dev/null || echo 0)" -le $((15 << 20)) ]; then
  rm -f "$out"/why_*.jsonl.gz
else
  rm -f "$out/why_events.tar"
  find "$out" -name 'why_*.jsonl.gz' ! -name why_eval.jsonl.gz -delete
  [ "$(stat -c %s "$out/why_eval.jsonl.gz" 2> /dev/null || echo 0)" -le $((15 << 20)) ] || rm -f "$out/why_eval.jsonl.gz"
fi
rm -rf "$work"
ls -la "$out" >> "$out/why.log"
cat "$out/why.log"
