#!/usr/bin/env bash
# GPU validation of `gpuprof whatif` (docs/whatif.md): four jobs (whatif_job.py), each recorded
# under the default allocator settings, under expandable_segments:True and under
# max_split_size_mb:128 (PYTORCH_CUDA_ALLOC_CONF, which the capture records), with PyTorch's own
# peak reserved and out-of-memory beside each recording. Then compare_whatif.py: the replay check
# on every recording under the settings it ran with, and the predictions made from the default
# recordings alone against the other two runs' counters. GPU_HISTORY=1 also keeps PyTorch's own
# memory history of the gpt and encoder jobs, to see where a replay parts from it.
#
#   GPUPROF_BIN=… OUT=/tmp/out tests/gpu/validate_whatif.sh [JOB ...]
source "$(dirname "$0")/env.sh"
jobs=("$@")
[ ${#jobs[@]} -gt 0 ] || jobs=(gpt encoder fragment halves)
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee "$out/device.txt"
for job in "${jobs[@]}"; do
  for setting in default expandable_segments:True max_split_size_mb:128; do
    tag=${setting%%:*}
    conf=$setting; [ "$setting" = default ] && conf=
    start=$(date +%s.%N)
    PYTORCH_CUDA_ALLOC_CONF=$conf "$bin" run --output "$out/$job.$tag.gpuprof" --stats \
      -- "$py" "$here/whatif_job.py" "$job" > "$out/$job.$tag.json" 2> "$out/$job.$tag.err"
    echo "$job $setting: exit $? in $(echo "$(date +%s.%N) - $start" | awk '{print $1 - $3}') s: $(cat "$out/$job.$tag.json")"
    tail -n 2 "$out/$job.$tag.err"
  done
done
"$py" "$here/compare_whatif.py" "$out" "$bin"
[ "${GPU_HISTORY:-0}" = 1 ] || exit 0
for job in gpt encoder; do
  printf '%s\n' "${jobs[@]}" | grep -qx "$job" || continue
  "$py" "$here/whatif_job.py" "$job" --history "$out/$job.history.pickle" > "$out/$job.history.json"
  echo "$job with PyTorch's memory history: $(cat "$out/$job.history.json")"
done
