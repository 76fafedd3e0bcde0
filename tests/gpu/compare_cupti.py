"""Compares the driver calls the shim's CUPTI callbacks saw with eBPF's and PyTorch's counters.

    compare_cupti.py SHIM.jsonl EBPF.jsonl|- STATS.json

STATS.json is torch_segments.py's output (pid, memory_stats() segment counts).
"""
import collections
import json
import sys

shim_path, ebpf_path, stats_path = sys.argv[1:4]
stats = json.load(open(stats_path))
pid = stats["pid"]


def driver_calls(path, source):
    calls = []
    for line in open(path):
        e = json.loads(line)
        if e.get("layer") == "driver" and e["pid"] == pid and e["source"] == source:
            calls.append(e)
    return calls


shim = driver_calls(shim_path, "shim")
count = lambda calls: collections.Counter((e["api"], e["result"]) for e in calls)  # noqa: E731
shim_counts = count(shim)
print("shim (CUPTI) driver calls (api/result=n):", ", ".join(f"{a}/{r}={n}" for (a, r), n in sorted(shim_counts.items())))
with_stack = sum(1 for e in shim if e.get("stack"))
print(f"shim calls with a Python stack: {with_stack} of {len(shim)}")
if ebpf_path != "-":
    ebpf = driver_calls(ebpf_path, "ebpf")
    ebpf_counts = count(ebpf)
    print("eBPF driver calls (api/result=n):", ", ".join(f"{a}/{r}={n}" for (a, r), n in sorted(ebpf_counts.items())))
    print("same (api, result) counts as eBPF:", shim_counts == ebpf_counts)
    key = lambda e: (e["api"], e["result"], e.get("addr"), e["size"])  # noqa: E731
    shim_keys, ebpf_keys = collections.Counter(map(key, shim)), collections.Counter(map(key, ebpf))
    print("same (api, result, addr, size) multiset as eBPF:", shim_keys == ebpf_keys)
    print("only eBPF saw:", dict(ebpf_keys - shim_keys), "only the shim saw:", dict(shim_keys - ebpf_keys))
if stats.get("conf", "").startswith("expandable"):
    alloc, free = "cuMemCreate", "cuMemRelease"
else:
    alloc, free = "cuMemAlloc_v2", "cuMemFree_v2"
print(f"torch segment.all.allocated={stats['segment.all.allocated']} segment.all.freed={stats['segment.all.freed']}; "
      f"shim {alloc} ok={shim_counts[(alloc, 0)]} {free} ok={shim_counts[(free, 0)]}")
