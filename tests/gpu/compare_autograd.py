"""Backward attribution on a real PyTorch run: how many allocator events and bytes carry a Python
stack (own, forward or forward_near), and, for the anomaly-mode step, whether each backward
block's node class and forward line equal the autograd graph's.

    python3 compare_autograd.py EVENTS.jsonl RESULT.json TRUTH.json
"""
import collections
import json
import sys

events_path, result_path, truth_path = sys.argv[1:4]
result = json.loads(open(result_path).read().strip().splitlines()[-1])
truth = {int(k): v for k, v in json.load(open(truth_path)).items()}
ended = result["ended_ns"]

events = collections.Counter()
nbytes = collections.Counter()
unattributed = collections.Counter()
checked = collections.Counter()
samples = []
# The anomaly-mode step's forward blocks: counter -> first and last innermost frame (to weigh
# which neighbour names a node that allocated nothing in its forward op more often).
forward_seen = {}
for line in open(events_path):
    e = json.loads(line)
    if e["layer"] != "allocator":
        continue
    if e["ts"] >= ended and "autograd_node" not in e and e["op"] == "alloc" and e["stack"] and "autograd_seq" in e:
        top = (e["stack"][0]["file"], e["stack"][0]["line"])
        seen = forward_seen.setdefault(e["autograd_seq"], [top, top])
        seen[1] = top
    origin = e.get("stack_origin", "own") if e["stack"] else "none"
    if e["ts"] < ended:
        events[origin] += 1
        if e["op"] == "alloc":
            nbytes[origin] += e["size"]
        if origin == "none":
            unattributed[(e["comm"], e.get("autograd_node", "-"), e["op"])] += 1
    elif "autograd_node" in e and e.get("autograd_seq") in truth:
        node = truth[e["autograd_seq"]]
        forward = e["stack"][1] if len(e["stack"]) > 1 else None
        same_node = node["node"] == e["autograd_node"]
        same_line = bool(forward and node["frame"] and forward["file"] == node["frame"]["file"]
                         and forward["line"] == node["frame"]["line"])
        checked[(e.get("stack_origin", "none"), "node ok" if same_node else "node differs",
                 "line ok" if same_line else "line differs")] += 1
        if len(samples) < 400:
            samples.append({"op": e["op"], "size": e["size"], "node": e["autograd_node"], "graph_node": node["node"],
                            "seq": e["autograd_seq"], "origin": e.get("stack_origin"),
                            "forward": forward and f'{forward["file"].split("/")[-1]}:{forward["line"]} {forward["function"]}',
                            "graph_forward": node["frame"] and f'{node["frame"]["file"].split("/")[-1]}:{node["frame"]["line"]} {node["frame"]["function"]}'})

total_events, total_bytes = sum(events.values()), sum(nbytes.values())
print(f"model {result['model']}: {total_events} allocator events, {total_bytes} bytes allocated in the measured steps")
for origin in ("own", "forward", "forward_near", "none"):
    print(f"  {origin:<13} {events[origin]:>9} events ({events[origin] / max(total_events, 1) * 100:6.2f}%)"
          f" {nbytes[origin]:>14} bytes ({nbytes[origin] / max(total_bytes, 1) * 100:6.2f}%)")
with_stack = total_events - events["none"]
print(f"  with a Python stack: {with_stack / max(total_events, 1) * 100:.2f}% of events, "
      f"{(total_bytes - nbytes['none']) / max(total_bytes, 1) * 100:.2f}% of bytes")
print("  without (thread, node, op):", unattributed.most_common(8))
print(f"anomaly-mode step: {len(truth)} graph nodes; backward blocks checked against the graph:")
for key, n in sorted(checked.items(), key=lambda kv: -kv[1]):
    print(f"  {n:>6}  {key}")
keys = sorted(forward_seen)
near = collections.Counter()
for seq, node in truth.items():
    if seq + 1 in forward_seen or not node["frame"]:
        continue
    want = (node["frame"]["file"], node["frame"]["line"])
    before = [k for k in keys if k <= seq]
    after = [k for k in keys if k > seq + 1]
    prev = forward_seen[before[-1]][1] if before else None
    nxt = forward_seen[after[0]][0] if after else None
    near[("prev right" if prev == want else "prev wrong", "next right" if nxt == want else "next wrong",
          "neighbours equal" if prev == nxt else "neighbours differ")] += 1
print("graph nodes whose forward op allocated nothing, by which neighbour has their line:")
for key, n in sorted(near.items(), key=lambda kv: -kv[1]):
    print(f"  {n:>6}  {key}")
print("samples (one per node class and origin):")
shown = set()
for s in samples:
    if (s["node"], s["origin"]) in shown:
        continue
    shown.add((s["node"], s["origin"]))
    print("  " + json.dumps(s))
