#!/usr/bin/env bash
# GPU validation of the HTML report (run on a machine with an NVIDIA GPU and PyTorch): `gpuprof run
# --html` on the allocator benchmark's loop (PyTorch's counters sampled at chosen steps) and on an
# evaluation loop that runs out of memory beside a neighbour holding a cache (torch_stories.py
# eval-oom); NVML's per-process memory sampled meanwhile. The pages are read back, and looked at,
# where a browser is (tests/gpu/compare_report.py).
#
#   GPUPROF_BIN=path/to/gpuprof OUT=/tmp/out tests/gpu/validate_report.sh
source "$(dirname "$0")/env.sh"
nvml() {
  while :; do
    echo "$(date +%s%N) $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | tr '\n' ';')"
    sleep 0.5
  done
}
{
  nvml > "$out/loop.nvml" & sampler=$!
  "$bin" run --output "$out/loop.gpuprof" --html "$out/loop.html" -- "$py" "$here/torch_report_loop.py" --steps 600 > "$out/loop.facts.json"
  echo "loop exit $?"
  kill $sampler
  nvml > "$out/oom.nvml" & sampler=$!
  "$bin" run --output "$out/oom.gpuprof" --html "$out/oom.html" -- "$py" "$here/torch_stories.py" eval-oom > "$out/oom.facts.jsonl"
  echo "oom exit $?"
  kill $sampler
  "$bin" summary "$out/loop.gpuprof" | head -20
  "$bin" report "$out/oom.gpuprof" -f table | head -40
  ls -la "$out"
} > "$out/report.log" 2>&1
cat "$out/report.log"
