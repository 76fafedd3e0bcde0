#!/usr/bin/env bash
# GPU validation of the in-process shim (libgpuprof_shim.so):
#  1. one PyTorch job captured by the shim (preloaded) and by gpuprof's eBPF probes at once:
#     both equal PyTorch's memory_stats() counters and allocated/reserved curves;
#  2. a spawned child (torch.multiprocessing) is captured too (LD_PRELOAD is inherited);
#  3. PyTorch's profiler (profile_memory=True) sees the same memory records with the shim as
#     without: every interposed call is forwarded;
#  4. `gpuprof run --via shim` (no eBPF) on the same job;
#  5. the daemon with --shim-socket and the job running the shim: one event per call;
#  6. the benchmark (SKIP_BENCH=1 skips it).
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
  echo "== 4. gpuprof run --via shim"
  "$bin" run --via shim --shim "$shim" --output "$out/via-shim.jsonl" -- "$py" "$here/torch_allocator.py" > "$out/via-shim.facts.json"
  echo "exit $?"
  "$py" "$here/compare_allocator.py" "$out/via-shim.jsonl" "$out/via-shim.facts.json"
  echo "== 4b. the shim as an injection library (CUDA_INJECTION64_PATH, no LD_PRELOAD)"
  rm -f "$out/injected.jsonl"
  CUDA_INJECTION64_PATH="$shim" GPUPROF_SHIM_OUTPUT="$out/injected.jsonl" "$py" "$here/torch_allocator.py" > "$out/injected.facts.json"
  echo "exit $?"
  "$py" "$here/compare_allocator.py" "$out/injected.jsonl" "$out/injected.facts.json"
  echo "== 5. the daemon, eBPF and shim together"
  "$bin" daemon --level tensors --output "$out/daemon-shim.jsonl" --listen 127.0.0.1:9465 --shim-socket "$out/shim.sock" > "$out/daemon-shim.stderr" 2>&1 &
  dpid=$!
  until curl -sf 127.0.0.1:9465/readyz > /dev/null; do sleep 0.05; done
  LD_PRELOAD="$shim" GPUPROF_SHIM_SOCKET="$out/shim.sock" "$py" "$here/torch_allocator.py" > "$out/daemon-shim.facts.json"
  sleep 2.5
  curl -s 127.0.0.1:9465/metrics | grep -E "^gpuprof_daemon_(events|shim_events|duplicates_dropped|shim_dropped|shim_refused)_total"
  kill -TERM $dpid; wait $dpid; echo "daemon exit $?"
  "$py" "$here/compare_allocator.py" "$out/daemon-shim.jsonl" "$out/daemon-shim.facts.json"
  "$py" - "$out" <<'PY'
import json, sys, collections
out = sys.argv[1]
pid = json.load(open(f"{out}/daemon-shim.facts.json"))["pid"]
events = [json.loads(l) for l in open(f"{out}/daemon-shim.jsonl")]
print("kept allocator events by source:", dict(collections.Counter(e["source"] for e in events if e["pid"] == pid and e["layer"] == "allocator")))
PY
  if [ -z "${SKIP_BENCH:-}" ]; then
    echo "== 6. benchmark"
    "$py" "$here/bench_shim.py" "$shim" --rounds 5 --steps 300
  fi
} > "$out/shim.log" 2>&1
cat "$out/shim.log"
