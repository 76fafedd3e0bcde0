#!/usr/bin/env bash
# GPU validation of `gpuprof whatif` (docs/whatif.md): four jobs (whatif_job.py), each recorded
# under the default allocator settings, under expandable_segments:True and under
# max_split_size_mb:128, with PyTorch's own peak reserved and out-of-memory step beside each
# recording. The predictions are made from the default recordings where the recordings are
# read (here or anywhere): `gpuprof whatif OUT/JOB.default.gpuprof --setting …`, and checked
# against the other two runs' counters; the replay check runs on every recording under the
# settings it ran with.
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
for job in gpt encoder; do
  printf '%s\n' "${jobs[@]}" | grep -qx "$job" || continue
  "$py" "$here/whatif_job.py" "$job" --history "$out/$job.history.pickle" > "$out/$job.history.json"
  echo "$job with PyTorch's memory history: $(cat "$out/$job.history.json")"
done
