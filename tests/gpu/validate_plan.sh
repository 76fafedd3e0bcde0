#!/usr/bin/env bash
# GPU validation of `gpuprof whatif --scale` (docs/whatif.md): plan_job.py (GPT-2 from its config,
# eager attention) recorded with `gpuprof run` at some sizes, and run at others for PyTorch's own
# peak reserved; then the predictions and the largest batch that fits against them.
#
#   GPUPROF_BIN=… OUT=/tmp/out tests/gpu/validate_plan.sh batch|length|largest
#
# batch:   recorded at batch 4, 8 and 16 (sequence 512) under the defaults, run at 24 and 32 under
#          the defaults and under expandable_segments:True; predictions from 8 and 16 (and from
#          4 and 8) at 24 and 32, for both settings, from the default recordings alone.
# length:  recorded at sequence 512, 768 and 1024 (batch 8), run at 1536 and 2048; the
#          predictions from the three, and from two. (At 256, as at batch 4, fewer tokens than
#          4,096 take another path in the embedding's backward pass: the plan refuses it.)
# largest: the largest batch on a 40 GiB device (sequence 512) from the recordings at 8 and 16
#          (batch must have run first), then the job at that batch and the next one with
#          torch.cuda.set_per_process_memory_fraction giving its allocator what the plan says;
#          the same under the best of the usual settings, when the plan names one.
source "$(dirname "$0")/env.sh"
record() { # NAME CONF ARGS…: recorded, PyTorch's counters in NAME.json
  local name=$1 conf=$2; shift 2
  PYTORCH_CUDA_ALLOC_CONF=$conf "$bin" run --output "$out/$name.gpuprof" -- "$py" "$here/plan_job.py" "$@" \
    > "$out/$name.json" 2> "$out/$name.err"
  echo "$name: exit $?: $(cat "$out/$name.json")"
}
plain() { # NAME CONF ARGS…: not recorded
  local name=$1 conf=$2; shift 2
  PYTORCH_CUDA_ALLOC_CONF=$conf "$py" "$here/plan_job.py" "$@" < /dev/null > "$out/$name.json" 2> "$out/$name.err"
  echo "$name: exit $?: $(cat "$out/$name.json")"
}
whatif() { "$bin" whatif "$@"; echo "whatif exit $?"; }
case ${1:?batch, length or largest} in
batch)
  for b in 4 8 16; do record "b$b" "" "$b" 512; done
  for b in 24 32; do plain "b$b" "" "$b" 512; plain "b$b.expandable" "expandable_segments:True" "$b" 512; done
  whatif "$out/b8.gpuprof" "$out/b16.gpuprof" --scale batch=8,16 --at 24,32 -s expandable_segments:True -f json -o "$out/plan.batch.json"
  whatif "$out/b8.gpuprof" "$out/b16.gpuprof" --scale batch=8,16 --at 24,32 -s expandable_segments:True -f table
  whatif "$out/b4.gpuprof" "$out/b8.gpuprof" --scale batch=4,8 --at 24,32 -f table
  ;;
length)
  for s in 512 768 1024; do record "s$s" "" 8 "$s"; done
  for s in 1536 2048; do plain "s$s" "" 8 "$s"; done
  three=("$out/s512.gpuprof" "$out/s768.gpuprof" "$out/s1024.gpuprof")
  whatif "${three[@]}" --scale seq_len=512,768,1024 --at 1536,2048 -f json -o "$out/plan.length.json"
  whatif "${three[@]}" --scale seq_len=512,768,1024 --at 1536,2048 -f table
  whatif "$out/s768.gpuprof" "$out/s1024.gpuprof" --scale seq_len=768,1024 --at 1536,2048 -f table
  ;;
largest)
  whatif "$out/b8.gpuprof" "$out/b16.gpuprof" --scale batch=8,16 --largest --device-memory 40GiB -f json -o "$out/plan.largest.json"
  whatif "$out/b8.gpuprof" "$out/b16.gpuprof" --scale batch=8,16 --largest --device-memory 40GiB -f html -o "$out/plan.html"
  total=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["total"])' "$out/b8.json")
  "$py" -c 'import json,sys; p=json.load(open(sys.argv[1]))["processes"][0]
for fit in p["largest"]: print(fit["setting"], fit["value"], p["budget"])' "$out/plan.largest.json" |
  while read -r setting largest budget; do
    conf=$setting; [ "$setting" = default ] && conf=
    fraction=$("$py" -c "print($budget / $total)")
    echo "$setting: largest $largest, allocator budget $budget of $total: fraction $fraction"
    plain "largest.$setting" "$conf" "$largest" 512 --fraction "$fraction"
    plain "largest+1.$setting" "$conf" "$((largest + 1))" 512 --fraction "$fraction"
  done
  ;;
esac
