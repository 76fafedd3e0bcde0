#!/usr/bin/env bash
# GPU validation of backward attribution: coverage of Python stacks over allocator events on the
# allocator benchmark's model and a GPT-style model, every backward block of an anomaly-mode step
# checked against the autograd graph, and the added cost (docs/gpu-validation.md, benchmarks.md).
#
# With VIA=shim, the same through the in-process shim (libgpuprof_shim.so next to gpuprof).
#
#   GPUPROF_BIN=path/to/gpuprof OUT=/tmp/out [VIA=shim] tests/gpu/validate_autograd.sh [steps] [bench rounds]
source "$(dirname "$0")/env.sh"
steps=${1:-30}
rounds=${2:-5}
via=${VIA:-ebpf}
for model in loop gpt; do
  {
    "$bin" run --via "$via" --stats --format jsonl --output "$out/$model.jsonl" -- \
      "$py" "$here/torch_autograd.py" --model "$model" --steps "$steps" --truth "$out/$model.truth.json" \
      > "$out/$model.result" 2> "$out/$model.stderr"
    echo "exit $?"
    grep -E "^gpuprof: [0-9]+ events|warning" "$out/$model.stderr" | tail -3
    cat "$out/$model.result"
    "$py" "$here/compare_autograd.py" "$out/$model.jsonl" "$out/$model.result" "$out/$model.truth.json"
  } > "$out/$model-$via.log" 2>&1
  rm -f "$out/$model.jsonl"
  cat "$out/$model-$via.log"
done
if [ "$rounds" -gt 0 ]; then
  "$py" "$here/bench_autograd.py" "$bin" --via "$via" --model loop --rounds "$rounds" --steps 200 > "$out/bench_loop-$via.log" 2>&1
  cat "$out/bench_loop-$via.log"
fi
