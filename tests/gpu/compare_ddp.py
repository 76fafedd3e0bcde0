"""What validate_ddp.sh's capture says per rank and device, beside each rank's own PyTorch
figures: python3 compare_ddp.py OUT (reads OUT/ddp.jsonl[.gz] and OUT/ranks.jsonl)."""
import collections
import gzip
import json
import os
import sys

out = sys.argv[1]
path = os.path.join(out, "ddp.jsonl")
events = [json.loads(line) for line in (open(path) if os.path.exists(path) else gzip.open(path + ".gz", "rt"))]
def objects(text):
    """The JSON objects in text: the ranks print at once, their lines may run together."""
    decoder, at = json.JSONDecoder(), 0
    while (at := text.find("{", at)) >= 0:
        value, at = decoder.raw_decode(text, at)
        yield value


ranks = {r["pid"]: r for r in objects(open(os.path.join(out, "ranks.jsonl")).read())}
MiB = 1 << 20
for pid, rank in sorted(ranks.items(), key=lambda kv: kv[1]["rank"]):
    mine = [e for e in events if e["pid"] == pid]
    tensors = [e for e in mine if e["layer"] == "allocator"]
    driver = [e for e in mine if e["layer"] == "driver"]
    print(f"rank {rank['rank']} pid {pid} device {rank['device']}")
    print(f"  tensor events by device: {dict(collections.Counter(e.get('device') for e in tensors))}; "
          f"allocations {sum(e['op'] == 'alloc' for e in tensors)} (PyTorch: {rank['alloc_count']})")
    print(f"  allocator's peak allocated {max(e['allocated'] for e in tensors)} (PyTorch's allocated_bytes.all.peak: "
          f"{rank['peak_allocated']}), most reserved {max(e['reserved'] for e in tensors)} (reserved when it printed: {rank['reserved']})")
    print(f"  driver events by device: {dict(collections.Counter(e.get('device') for e in driver))}")
    live = collections.defaultdict(int)  # (device, kind) -> bytes, at the end of the capture
    sizes = {}
    for e in driver:
        if e["result"] != 0 or e["op"] not in ("alloc", "free") or e.get("kind") is None:
            continue
        key = (e["kind"], e["addr"])
        if e["op"] == "alloc":
            sizes[key] = (e.get("device"), e["size"])
            live[(e.get("device"), e["kind"])] += e["size"]
        elif key in sizes:
            device, size = sizes.pop(key)
            live[(device, e["kind"])] -= size
    print("  driver bytes allocated and not freed, by (device, kind):",
          {f"{d}/{k}": f"{b / MiB:.1f} MiB" for (d, k), b in sorted(live.items(), key=str) if b})
    nccl = [e for e in driver if (e.get("caller_module") or "").startswith("libnccl")]
    print(f"  NCCL: {len(nccl)} driver calls, cuMemCreate {sum(e['size'] for e in nccl if e['api'] == 'cuMemCreate') / MiB:.1f} MiB "
          f"on devices {dict(collections.Counter(e.get('device') for e in nccl if e['api'] == 'cuMemCreate'))}")
    imports = [e for e in driver if e["op"] == "ipc_open"]
    print(f"  imports {len(imports)}, peers {dict(collections.Counter(e.get('peer_pid') for e in imports))}")

processes_path = os.path.join(out, "processes.json")
if os.path.exists(processes_path):
    print("collector, while the ranks held their memory:")
    for view in json.load(open(processes_path)):
        if view["pid"] in ranks and view["state"] == "running":
            print(f"  pid {view['pid']} (rank {ranks[view['pid']]['rank']}): live_bytes_by_device "
                  f"{ {d: f'{b / MiB:.1f} MiB' for d, b in view['live_bytes_by_device'].items()} }, allocator "
                  f"{ {d: a['allocated'] for d, a in view['allocator'].items()} }")
findings_path = os.path.join(out, "ddp.findings.json")
if os.path.exists(findings_path):
    print("findings:", [(f["kind"], f["pid"], f.get("rank")) for f in json.load(open(findings_path))])
