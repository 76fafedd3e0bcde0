"""Allocator-level events vs PyTorch's counters and curves (validate_allocator.sh, validate_daemon.sh).

    compare_allocator.py OUT                      allocator.facts.json against allocator.jsonl
    compare_allocator.py EVENTS FACTS [FACTS…]    each workload's facts against one event file
"""
import json
import sys
from pathlib import Path


def compare(facts, events):
    """Prints the comparison for one workload; returns the number of mismatches."""
    blocks = [e for e in events if e["layer"] == "allocator" and e["pid"] == facts["pid"]]
    # Counted up to the moment the workload read its stats (tensors are freed again at exit).
    allocs = sum(1 for e in blocks if e["op"] == "alloc" and e["ts"] <= facts["stats_ts"])
    frees = sum(1 for e in blocks if e["op"] == "free" and e["ts"] <= facts["stats_ts"])
    # The curves: every event that carries the allocator's totals (block events, and the driver
    # frees of its segments, which the allocator itself does not report).
    curve = [e for e in events if e["pid"] == facts["pid"] and "reserved" in e]
    ok = allocs == facts["allocations"] and frees == facts["frees"]
    print(f"pid {facts['pid']}: allocator events: alloc {allocs} / free {frees}; torch allocation.all.allocated "
          f"{facts['allocations']} / freed {facts['frees']} -> {'ok' if ok else 'MISMATCH'}")
    failures = 0 if ok else 1
    for s in facts["samples"]:
        before = [e for e in curve if e["ts"] <= s["ts"]]
        got = (before[-1]["allocated"], before[-1]["reserved"]) if before else (0, 0)
        want = (s["allocated"], s["reserved"])
        verdict = "ok" if got == want else "MISMATCH"
        failures += verdict != "ok"
        print(f"{s['label']:>20}: torch allocated/reserved {want[0]:>10} {want[1]:>10}   gpuprof {got[0]:>10} {got[1]:>10}  {verdict}")
    with_stack = sum(1 for e in blocks if e["stack"])
    segmented = sum(1 for e in blocks if e.get("segment"))
    print(f"blocks with a Python stack: {with_stack}/{len(blocks)}; tied to a driver segment: {segmented}/{len(blocks)}")
    return failures


def read_events(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


if __name__ == "__main__":
    if len(sys.argv) == 2:
        out = Path(sys.argv[1])
        pairs = [(json.loads((out / "allocator.facts.json").read_text()), read_events(out / "allocator.jsonl"))]
    else:
        events = read_events(sys.argv[1])
        pairs = [(json.loads(Path(f).read_text()), events) for f in sys.argv[2:]]
    sys.exit(1 if sum(compare(facts, events) for facts, events in pairs) else 0)
