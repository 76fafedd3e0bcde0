#!/usr/bin/env bash
# GPU validation of allocator-level capture and its views (run on a machine with an NVIDIA GPU
# and PyTorch): event counts and the allocated/reserved curves against PyTorch's counters, a
# memory_viz snapshot rendered by PyTorch's own torch.cuda._memory_viz, and the cost benchmark.
#
#   GPUPROF_BIN=path/to/gpuprof OUT=/tmp/out tests/gpu/validate_allocator.sh
#   SKIP_BENCH=1 leaves the benchmark out (validation and views only).
source "$(dirname "$0")/env.sh"
{
  "$bin" run --output "$out/allocator.jsonl" -- "$py" "$here/torch_allocator.py" > "$out/allocator.facts.json"
  echo "exit $?"
  "$py" "$here/compare_allocator.py" "$out"
  echo "compare exit $?"
  pid=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['pid'])" "$out/allocator.facts.json")
  "$bin" export --input "$out/allocator.jsonl" --format memory-viz --pid "$pid" --output "$out/snapshot.pickle"
  "$py" -m torch.cuda._memory_viz trace_plot "$out/snapshot.pickle" -o "$out/memory_viz.html"
  echo "trace_plot exit $? ($(wc -c < "$out/memory_viz.html") bytes)"
  "$py" -m torch.cuda._memory_viz stats "$out/snapshot.pickle" | tail -6
  viz=$("$py" -c "import torch, pathlib; p = pathlib.Path(torch.__file__).parent / 'utils/viz/MemoryViz.js'; print(p if p.exists() else '')")
  [ -n "$viz" ] && cp "$viz" "$out/MemoryViz.js"
  grep -o 'import [^;]*MemoryViz[^;]*' "$out/memory_viz.html" | head -2
  # The live tensors right after the 64 MiB one was made, as a flame graph and folded stacks.
  at=$("$py" -c "
import json, sys
facts = json.load(open(sys.argv[1])); first = json.loads(open(sys.argv[2]).readline())['ts']
sample = next(s for s in facts['samples'] if s['label'] == 'after 64 MiB tensor')
print((sample['ts'] - first) / 1e9)" "$out/allocator.facts.json" "$out/allocator.jsonl")
  "$bin" export --input "$out/allocator.jsonl" --format flamegraph --layer allocator --at "$at" --output "$out/tensors.svg"
  "$bin" export --input "$out/allocator.jsonl" --format folded --layer allocator --at "$at" | sort -t' ' -k2 -n | tail -3 | cut -c1-240
  if [ -z "${SKIP_BENCH:-}" ]; then
    echo "# benchmark"
    "$py" "$here/bench_allocator.py" "$bin" --rounds 3 --steps 300
  fi
} > "$out/allocator.log" 2>&1
cat "$out/allocator.log"
