"""Checks that gpuprof named the known allocating lines of torch_stacks.py (validate_stacks.sh)."""
import collections
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
facts = json.loads((out / "stacks.facts.json").read_text())
events = [json.loads(line) for line in (out / "stacks.jsonl").read_text().splitlines()]
allocs = [e for e in events if e["layer"] == "driver" and e["pid"] == facts["pid"] and e["api"] == "cuMemAlloc_v2" and e["result"] == 0]
failures = 0
for known in facts["known"]:
    matching = [e for e in allocs if e["size"] == known["size"]]
    want = {"function": known["function"], "file": facts["file"], "line": known["line"]}
    got = matching[0]["stack"][0] if matching and matching[0]["stack"] else None
    verdict = "ok" if got == want else "MISMATCH"
    failures += verdict != "ok"
    print(f"{known['size'] >> 20} MiB segment: expected {want['function']} line {want['line']}, gpuprof innermost frame {got} -> {verdict}")
with_stack = sum(1 for e in allocs if e["stack"])
print(f"cuMemAlloc_v2 events of the process: {len(allocs)} ({with_stack} with a Python stack); torch segment.all.allocated={facts['segments']}")
by_frame = collections.Counter()
for e in allocs:
    frame = e["stack"][0] if e["stack"] else None
    key = f"{Path(frame['file']).name}:{frame['line']} {frame['function']}" if frame else "(no Python stack)"
    by_frame[key] += e["size"]
print("segment bytes by innermost frame:")
for key, size in by_frame.most_common():
    print(f"  {size >> 20:>6} MiB  {key}")
sample = next((e for e in allocs if e["size"] == facts["known"][0]["size"]), None)
if sample:
    print("full stack of the 300 MiB segment: " + " <- ".join(f"{f['function']}:{f['line']}" for f in sample["stack"]))
sys.exit(1 if failures else 0)
