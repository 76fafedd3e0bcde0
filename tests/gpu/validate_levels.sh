#!/usr/bin/env bash
# GPU validation of capture levels, the shim's stream and the stacks sent by hash:
#  1. allocator events of one job through eBPF (`run`) and through the shim (`run --via shim`)
#     against PyTorch's counters and curves (compare_allocator.py), with their Python stacks;
#  2. a job that keeps 1 MiB a step under `gpuprof daemon` at its defaults (the driver's level):
#     raised to its tensors when its memory grows, and the growth reported at the user's line;
#     nvidia-smi's view of it meanwhile;
#  3. 500,000 reports through PyTorch's own libc10 (a library importing it, as libc10_cuda does)
#     into `run --via shim`: every one arrives.
#
#   GPUPROF_BIN=… OUT=/tmp/out tests/gpu/validate_levels.sh
source "$(dirname "$0")/env.sh"
{
  echo "== 1. eBPF and the shim against PyTorch's counters"
  "$bin" run --output "$out/ebpf.jsonl" -- "$py" "$here/torch_allocator.py" > "$out/ebpf.facts.json"
  echo "ebpf exit $?"; "$py" "$here/compare_allocator.py" "$out/ebpf.jsonl" "$out/ebpf.facts.json"
  "$bin" run --via shim --output "$out/shim.jsonl" -- "$py" "$here/torch_allocator.py" > "$out/shim.facts.json"
  echo "shim exit $?"; "$py" "$here/compare_allocator.py" "$out/shim.jsonl" "$out/shim.facts.json"
  for capture in ebpf shim; do
    "$py" - "$out/$capture.jsonl" "$capture" <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
blocks = [e for e in events if e["layer"] == "allocator"]
stacked = sum(1 for e in blocks if e["stack"])
origins = {}
for e in blocks:
    key = e.get("stack_origin", "own") if e["stack"] else "none"
    origins[key] = origins.get(key, 0) + 1
print(f"{sys.argv[2]}: stacks by origin {dict(sorted(origins.items()))}")
lines = {}
for e in blocks:
    if e["stack"]:
        top = next((f for f in e["stack"] if "torch_allocator.py" in f["file"]), None)
        if top:
            lines[top["line"]] = lines.get(top["line"], 0) + 1
print(f"{sys.argv[2]}: {len(blocks)} allocator events, {stacked} with a Python stack; at torch_allocator.py lines {dict(sorted(lines.items()))}")
PY
  done

  echo "== 2. a leak under the daemon's defaults"
  "$bin" daemon --listen 127.0.0.1:9464 --output "$out/daemon.jsonl" --growth-window 2 2> "$out/daemon.err" &
  daemon=$!
  for _ in $(seq 100); do curl -sf 127.0.0.1:9464/readyz >/dev/null && break; sleep 0.1; done
  "$py" "$here/torch_leak_job.py" 40 > "$out/leak.json" &
  job=$!
  sleep 20
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
  curl -s 127.0.0.1:9464/v1/levels; echo
  wait $job
  sleep 3
  kill -TERM $daemon; wait $daemon
  cat "$out/leak.json"
  grep -E "capturing tensors|back to driver|finding" "$out/daemon.err" | cut -c1-400
  "$py" - "$out/daemon.jsonl" "$out/leak.json" <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
job = json.load(open(sys.argv[2]))
mine = [e for e in events if e["pid"] == job["pid"]]
blocks = [e for e in mine if e["layer"] == "allocator"]
driver = [e for e in mine if e["layer"] == "driver"]
first = min(e["ts"] for e in mine)
print(f"job {job['pid']}: {len(driver)} driver events from {0:.1f} s, {len(blocks)} tensor events "
      f"from {(min(e['ts'] for e in blocks) - first) / 1e9:.1f} s to {(max(e['ts'] for e in blocks) - first) / 1e9:.1f} s" if blocks else
      f"job {job['pid']}: {len(driver)} driver events, no tensor events")
at_line = sum(1 for e in blocks if any(f["line"] == job["leak_line"] and f["file"] == job["leak_file"] for f in e["stack"]))
print(f"tensor events with the leaking line ({job['leak_file']}:{job['leak_line']}) in their stack: {at_line}")
PY

  echo "== 3. 500,000 reports through PyTorch's libc10 into the shim"
  torch_lib=$("$py" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  gcc -O2 -shared -fPIC -o "$out/libburst.so" "$here/libc10_burst.c" -L"$torch_lib" -lc10 -Wl,-rpath,"$torch_lib"
  cat > "$out/burst.py" <<PY
import ctypes, sys, time
lib = ctypes.CDLL("$out/libburst.so")
lib.burst.argtypes = [ctypes.c_uint64]
def nested(depth):
    if depth:
        return nested(depth - 1)
    started = time.perf_counter()
    lib.burst(500000)
    print(f"500000 reports in {time.perf_counter() - started:.3f} s", flush=True)
nested(30)
PY
  "$bin" run --via shim --output "$out/burst.gpuprof" -- "$py" "$out/burst.py" 2>&1 | grep -E "reports in|via the shim"
  "$bin" summary "$out/burst.gpuprof" -f json | "$py" -c 'import json,sys; p=json.load(sys.stdin)["processes"][0]; print("allocated", p["allocated"], "at end", p["at_end"], "where", p["rows"][0]["where"])'
} > "$out/levels.log" 2>&1
# The million-event file stays here; the smaller ones come back compressed.
rm -f "$out/daemon.jsonl"
gzip -f "$out"/*.jsonl
cat "$out/levels.log"
