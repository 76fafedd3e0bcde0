#!/usr/bin/env bash
# GPU validation of the shim's CUPTI path (driver memory entry points through CUPTI callbacks,
# cross-checked with CUPTI's memory activity records):
#  1. one PyTorch job with the shim preloaded and gpuprof's eBPF probes at once, default
#     allocator and expandable segments: the shim's driver calls equal eBPF's, and the segment
#     calls equal memory_stats(); the shim's counters line (GPUPROF_SHIM_REPORT) shows the
#     activity records' counts beside the callbacks';
#  2. the shim as an injection library only (CUDA_INJECTION64_PATH);
#  3. a spawned child (torch.multiprocessing): IPC calls in both processes;
#  4. PyTorch's profiler with the shim: CUDA kernels and memory records still in the profile;
#     and a profiler started before CUDA: which subscriber gets the slot, said once;
#  5. the daemon, eBPF and shim together: one event per driver call;
#  6. DataLoader workers (spawned, touching CUDA): per process, the shim's events and exits
#     beside eBPF's.
#
#   GPUPROF_BIN=… SHIM=path/to/libgpuprof_shim.so OUT=/tmp/out tests/gpu/validate_cupti.sh
source "$(dirname "$0")/env.sh"
shim=${SHIM:?set SHIM to libgpuprof_shim.so}
{
  for conf in "" "expandable_segments:True"; do
    name=default; [ -n "$conf" ] && name=expandable
    echo "== 1. CUPTI callbacks and eBPF on the same job ($name)"
    rm -f "$out/cupti-$name.jsonl"
    PYTORCH_CUDA_ALLOC_CONF="$conf" "$bin" run --output "$out/cupti-$name-ebpf.jsonl" -- \
      env LD_PRELOAD="$shim" GPUPROF_SHIM_OUTPUT="$out/cupti-$name.jsonl" GPUPROF_SHIM_REPORT=1 \
      "$py" "$here/torch_segments.py" > "$out/cupti-$name.stats.json" 2> "$out/cupti-$name.stderr"
    echo "exit $?"; grep -v "^gpuprof: " "$out/cupti-$name.stderr"
    "$py" "$here/compare_cupti.py" "$out/cupti-$name.jsonl" "$out/cupti-$name-ebpf.jsonl" "$out/cupti-$name.stats.json"
  done
  echo "== 2. injection only"
  rm -f "$out/cupti-injected.jsonl"
  CUDA_INJECTION64_PATH="$shim" GPUPROF_SHIM_OUTPUT="$out/cupti-injected.jsonl" GPUPROF_SHIM_REPORT=1 \
    "$py" "$here/torch_segments.py" > "$out/cupti-injected.stats.json"
  echo "exit $?"
  "$py" "$here/compare_cupti.py" "$out/cupti-injected.jsonl" - "$out/cupti-injected.stats.json"
  echo "== 3. a spawned child"
  rm -f "$out/cupti-ipc.jsonl"
  LD_PRELOAD="$shim" GPUPROF_SHIM_OUTPUT="$out/cupti-ipc.jsonl" "$py" "$here/torch_ipc.py" > "$out/cupti-ipc.json"
  echo "exit $?"; cat "$out/cupti-ipc.json"
  "$py" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
facts = json.load(open(f"{out}/cupti-ipc.json"))
events = [json.loads(l) for l in open(f"{out}/cupti-ipc.jsonl")]
for pid, role in ((facts["parent_pid"], "parent"), (facts["child_pid"], "child")):
    ipc = [(e["api"], e["result"], e.get("addr"), (e.get("handle") or "")[:16], len(e.get("stack", []))) for e in events
           if e["pid"] == pid and e["layer"] == "driver" and e["op"].startswith("ipc_")]
    print(f"{role} {pid} IPC calls (api, result, addr, handle[:8 bytes], stack depth): {ipc}")
PY
  echo "== 4. PyTorch's profiler: without the shim, with it, and profiling from before CUDA starts"
  "$py" "$here/torch_profiler_memory.py"
  rm -f "$out/cupti-prof.jsonl"
  LD_PRELOAD="$shim" GPUPROF_SHIM_OUTPUT="$out/cupti-prof.jsonl" GPUPROF_SHIM_REPORT=1 "$py" "$here/torch_profiler_memory.py"
  echo "shim driver events: $(grep -c '"layer":"driver"' "$out/cupti-prof.jsonl") allocator events: $(grep -c '"layer":"allocator"' "$out/cupti-prof.jsonl")"
  rm -f "$out/cupti-prof-first.jsonl"
  PROFILE_FROM_START=1 LD_PRELOAD="$shim" GPUPROF_SHIM_OUTPUT="$out/cupti-prof-first.jsonl" GPUPROF_SHIM_REPORT=1 "$py" "$here/torch_profiler_memory.py"
  echo "shim driver events: $(grep -c '"layer":"driver"' "$out/cupti-prof-first.jsonl") allocator events: $(grep -c '"layer":"allocator"' "$out/cupti-prof-first.jsonl")"
  echo "== 5. the daemon, eBPF and shim together"
  "$bin" daemon --output "$out/cupti-daemon.jsonl" --listen 127.0.0.1:9466 --shim-socket "$out/cupti.sock" > "$out/cupti-daemon.stderr" 2>&1 &
  dpid=$!
  until curl -sf 127.0.0.1:9466/readyz > /dev/null; do sleep 0.05; done
  LD_PRELOAD="$shim" GPUPROF_SHIM_SOCKET="$out/cupti.sock" "$py" "$here/torch_segments.py" > "$out/cupti-daemon.stats.json"
  sleep 2.5
  curl -s 127.0.0.1:9466/metrics | grep -E "^gpuprof_daemon_(events|shim_events|duplicates_dropped|shim_dropped)_total"
  kill -TERM $dpid; wait $dpid; echo "daemon exit $?"; tail -3 "$out/cupti-daemon.stderr"
  "$py" - "$out" <<'PY'
import collections, json, sys
out = sys.argv[1]
stats = json.load(open(f"{out}/cupti-daemon.stats.json"))
events = [json.loads(l) for l in open(f"{out}/cupti-daemon.jsonl")]
mine = [e for e in events if e["pid"] == stats["pid"]]
print("kept driver events by (api, source):", dict(collections.Counter((e["api"], e["source"]) for e in mine if e["layer"] == "driver")))
print("torch segments:", stats["segment.all.allocated"], stats["segment.all.freed"])
PY
  echo "== 6. DataLoader workers"
  rm -f "$out/cupti-loader.jsonl"
  "$bin" run --output "$out/cupti-loader-ebpf.jsonl" -- env LD_PRELOAD="$shim" GPUPROF_SHIM_OUTPUT="$out/cupti-loader.jsonl" \
    "$py" "$here/torch_dataloader.py" > "$out/cupti-loader.json" 2> "$out/cupti-loader.stderr"
  echo "exit $?"; cat "$out/cupti-loader.json"
  "$py" - "$out" <<'PY'
import collections, json, sys
out = sys.argv[1]
def load(name):
    return [json.loads(l) for l in open(f"{out}/{name}")]
shim, ebpf = load("cupti-loader.jsonl"), load("cupti-loader-ebpf.jsonl")
count = lambda evs: collections.Counter((e["pid"], e["layer"], e["op"]) for e in evs if e["layer"] != "process" or e["op"] == "exit")  # noqa: E731
s, b = count(shim), count([e for e in ebpf if e["source"] == "ebpf"])
for pid in sorted({p for p, _, _ in s} | {p for p, _, _ in b}):
    print(pid, "shim:", {f"{l}/{o}": n for (p, l, o), n in sorted(s.items()) if p == pid},
          "eBPF:", {f"{l}/{o}": n for (p, l, o), n in sorted(b.items()) if p == pid})
PY
} > "$out/cupti.log" 2>&1
cat "$out/cupti.log"
