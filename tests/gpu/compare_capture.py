"""Compares gpuprof's captured driver events with PyTorch's counters (validate_capture.sh)."""
import collections
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])


def events(name):
    return [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]


def counts(evs, pid):
    c = collections.Counter()
    for e in evs:
        if e["layer"] == "driver" and e["pid"] == pid:
            c[(e["api"], e["result"])] += 1
    return c


def peak_live(evs, pid, alloc_api, free_api):
    live, peak, sizes = 0, 0, {}
    for e in evs:
        if e["layer"] != "driver" or e["pid"] != pid or e["result"] != 0:
            continue
        if e["api"] == alloc_api:
            sizes[e["addr"]] = e["size"]
            live += e["size"]
        elif e["api"] == free_api and e["addr"] in sizes:
            live -= sizes.pop(e["addr"])
        peak = max(peak, live)
    return peak, live


lines = []
for name, alloc_api, free_api in (("default", "cuMemAlloc_v2", "cuMemFree_v2"), ("expandable", "cuMemCreate", "cuMemRelease")):
    stats = json.loads((out / f"{name}.stats.json").read_text())
    evs = events(name)
    c = counts(evs, stats["pid"])
    peak, live = peak_live(evs, stats["pid"], alloc_api, free_api)
    lines.append(f"## {name} allocator (PYTORCH_CUDA_ALLOC_CONF={stats['conf']!r})")
    lines.append(f"torch segment.all.allocated={stats['segment.all.allocated']} segment.all.freed={stats['segment.all.freed']} "
                 f"reserved_bytes.all.peak={stats['reserved_bytes.all.peak']} reserved_bytes.all.current={stats['reserved_bytes.all.current']}")
    lines.append(f"gpuprof {alloc_api} ok={c[(alloc_api, 0)]} {free_api} ok={c[(free_api, 0)]} "
                 f"peak live={peak} live at end={live}")
    lines.append("gpuprof driver calls (api, result): " + ", ".join(f"{a}/{r}={n}" for (a, r), n in sorted(c.items())))
    lines.append("")

stats = json.loads((out / "ipc.stats.json").read_text())
evs = events("ipc")
lines.append("## torch.multiprocessing CUDA tensor to a spawned worker")
lines.append(f"workload: {stats}")
for pid, role in ((stats["parent_pid"], "parent"), (stats["child_pid"], "child")):
    ipc = [(e["api"], e["result"], e["addr"], e.get("handle", "")[:16]) for e in evs
           if e["layer"] == "driver" and e["pid"] == pid and e["op"].startswith("ipc_")]
    lines.append(f"{role} {pid}: {ipc}")
procs = [(e["op"], e["pid"], e.get("ppid"), e.get("exit_code")) for e in evs if e["layer"] == "process" and e["op"] in ("fork", "exit")]
lines.append(f"process events (op, pid, ppid, exit): {procs}")
print("\n".join(lines))
