"""One line per finding of a findings file: kind, severity, pid, peer, bytes, count, the user's
line, the id; then the sentence."""
import json
import sys

for f in json.load(open(sys.argv[1])):
    user = f.get("user_frame")
    line = f"{user['file'].rsplit('/', 1)[-1]}:{user['line']} {user['function']}" if user else "-"
    extra = ""
    if f.get("segment_bytes") is not None:
        extra += f" segments {f['segment_bytes']}"
    if f.get("stacks"):
        extra += f" stacks {len(f['stacks'])}"
    if f["kind"] == "oom":
        extra += " fragmentation" if f.get("fragmentation") else ""
        extra += " caches " + ", ".join(f"{p['pid']}:{p.get('allocated')}/{p.get('reserved')}" for p in f.get("processes", []))
    print(f"  {f['kind']} [{f['severity']}] pid {f['pid']} peer {f.get('peer_pid')} bytes {f['bytes']} count {f['count']} at {line} id {f['finding_id']}{extra}")
    print(f"    {f['detail']}")
