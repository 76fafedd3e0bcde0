#!/usr/bin/env bash
# GPU validation of caller_module: which library called libcuda, for every driver event of a
# PyTorch training step and an NCCL all-reduce (docs/events.md).
#
# With VIA=shim, through the in-process shim's CUPTI callbacks (libgpuprof_shim.so next to gpuprof).
#
#   GPUPROF_BIN=path/to/gpuprof OUT=/tmp/out [VIA=shim] tests/gpu/validate_callers.sh
source "$(dirname "$0")/env.sh"
via=${VIA:-ebpf}
{
  "$bin" run --via "$via" --format jsonl --output "$out/callers.jsonl" -- "$py" "$here/torch_callers.py" 2> "$out/callers.stderr"
  echo "exit $?"
  grep -E "^gpuprof: [0-9]+ events" "$out/callers.stderr"
  python3 - "$out/callers.jsonl" <<'PY'
import collections, json, sys
rows = collections.Counter(); size = collections.Counter()
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e["layer"] != "driver":
        continue
    key = (e["api"], e.get("caller_module", "-"), "stack" if e["stack"] else "no stack")
    rows[key] += 1; size[key] += e.get("size", 0) if e["op"] in ("alloc", "map") else 0
for key, n in sorted(rows.items(), key=lambda kv: -kv[1]):
    print(f"{n:6} {size[key]:>12}  {key[0]:<28} {key[1]:<24} {key[2]}")
PY
} > "$out/callers-$via.log" 2>&1
xz -9 "$out/callers.jsonl"
cat "$out/callers-$via.log"
