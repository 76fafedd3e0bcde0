#!/usr/bin/env bash
# GPU validation of the in-process shim (libgpuprof_shim.so):
#  1. one PyTorch job captured by the shim (preloaded) and by gpuprof's eBPF probes at once:
#     both equal PyTorch's memory_stats() counters and allocated/reserved curves;
#  2. a spawned child (torch.multiprocessing) is captured too (LD_PRELOAD is inherited);
#  3. PyTorch's profiler (profile_memory=True) sees the same memory records with the shim as
#     without: every interposed call is forwarded;
#  4. the benchmark (SKIP_BENCH=1 skips it).
#
#   GPUPROF_BIN=… SHIM=path/to/libgpuprof_shim.so OUT=/tmp/out tests/gpu/validate_shim.sh
source "$(dirname "$0")/env.sh"
shim=${SHIM:?set SHIM to libgpuprof_shim.so}
{
  echo "== 1. shim and eBPF on the same job"
  "$bin" run --output "$out/shim-ebpf.jsonl" -- env LD_PRELOAD="$shim" GPUPROF_SHIM_OUTPUT="$out/shim.jsonl" \
    "$py" "$here/torch_allocator.py" > "$out/shim.facts.json"
  echo "exit $?"
  echo "-- shim:"; "$py" "$here/compare_allocator.py" "$out/shim.jsonl" "$out/shim.facts.json"
  echo "-- eBPF:"; "$py" "$here/compare_allocator.py" "$out/shim-ebpf.jsonl" "$out/shim.facts.json"
  echo "== 2. a spawned child"
  rm -f "$out/shim-ipc.jsonl"
  LD_PRELOAD="$shim" GPUPROF_SHIM_OUTPUT="$out/shim-ipc.jsonl" "$py" "$here/torch_ipc.py" > "$out/shim-ipc.json"
  echo "exit $?"; cat "$out/shim-ipc.json"
  "$py" - "$out" <<'PY'
import json, sys, collections
out = sys.argv[1]
facts = json.load(open(f"{out}/shim-ipc.json"))
events = [json.loads(l) for l in open(f"{out}/shim-ipc.jsonl")]
by_pid = collections.Counter((e["pid"], e["layer"], e["op"]) for e in events)
print("events by (pid, layer, op):", dict(by_pid))
print("parent captured:", any(p == facts["parent_pid"] for p, _, _ in by_pid), "child captured:", any(p == facts["child_pid"] for p, _, _ in by_pid))
PY
  echo "== 3. PyTorch's profiler, without and with the shim"
  "$py" "$here/torch_profiler_memory.py"
  rm -f "$out/shim-prof.jsonl"
  LD_PRELOAD="$shim" GPUPROF_SHIM_OUTPUT="$out/shim-prof.jsonl" "$py" "$here/torch_profiler_memory.py"
  echo "shim events: $(grep -c '"layer":"allocator"' "$out/shim-prof.jsonl")"
  if [ -z "${SKIP_BENCH:-}" ]; then
    echo "== 4. benchmark"
    "$py" "$here/bench_shim.py" "$shim" --rounds 5 --steps 300
  fi
} > "$out/shim.log" 2>&1
cat "$out/shim.log"
