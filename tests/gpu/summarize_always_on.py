"""What the collector said of each job of tests/gpu/validate_always_on.sh, beside what each job
printed of itself, and whether it is what a serious tool must say: one leak per problem and
process, at its line with its diagnosis; none for the healthy job; the OOM's post-mortem naming
what PyTorch held at the failure.

    summarize_always_on.py WORK_DIR
"""

import collections
import json
import os
import sys

work = sys.argv[1]
findings = json.load(open(os.path.join(work, "findings.json")))
checks = []


def check(what, ok, seen):
    checks.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {what}: {seen}")


def facts(name):
    path = os.path.join(work, f"{name}.facts")
    lines = [json.loads(line) for line in open(path) if line.startswith("{")]
    return lines


def where(finding):
    frame = finding.get("user_frame") or {}
    return f"{os.path.basename(frame.get('file', '?'))}:{frame.get('line', '?')}"


by_pid = collections.defaultdict(list)
for finding in findings:
    by_pid[finding["pid"]].append(finding)


def leaks(pid):
    return [f for f in by_pid.get(pid, []) if f["severity"] == "leak"]


def describe(pid):
    return [(f["kind"], f["severity"], where(f), f.get("diagnosis")) for f in by_pid.get(pid, [])]


print(f"{len(findings)} findings at the collector, {sum(f['severity'] == 'leak' for f in findings)} leaks")
for finding in findings:
    print(
        f"  pid {finding['pid']} {finding['kind']} [{finding['severity']}] {where(finding)} "
        f"{finding.get('diagnosis') or ''} {finding['detail'][:160]}"
    )

healthy = facts("healthy")[0]
check("healthy loop: no leak", not leaks(healthy["pid"]), describe(healthy["pid"]))

for name, diagnosis in [("list_keep", "tensors_kept_by_user_code"), ("loss_sum", "autograd_graph_retained")]:
    job = facts(name)[0]
    found = leaks(job["pid"])
    lines = job.get("lines", {})
    check(f"{name}: exactly one leak, a growth", [f["kind"] for f in found] == ["growth"], describe(job["pid"]))
    if found:
        check(f"{name}: diagnosis {diagnosis}", found[0].get("diagnosis") == diagnosis, found[0].get("diagnosis"))
        line = (found[0].get("user_frame") or {}).get("line")
        check(f"{name}: at one of its own lines {lines}", line in lines.values(), where(found[0]))

loader = facts("dataloader")[0]
workers = [f for f in findings if f["kind"] == "worker_cuda_context" and f.get("peer_pid") == loader["parent_pid"]]
check(
    "dataloader: a worker_cuda_context leak per worker",
    len(workers) == 2 and all(f["severity"] == "leak" for f in workers),
    [(f["pid"], f["severity"]) for f in workers],
)
for worker in workers:
    check(
        f"dataloader worker {worker['pid']}: no other leak",
        [f["kind"] for f in leaks(worker["pid"])] == ["worker_cuda_context"],
        describe(worker["pid"]),
    )
check("dataloader parent: no leak", not leaks(loader["parent_pid"]), describe(loader["parent_pid"]))

stories = facts("orphans")
launcher = next(line for line in stories if line["role"] == "launcher")
orphans = [line for line in stories if line["role"] == "worker"]
for orphan in orphans:
    check(
        f"orphan {orphan['pid']}: one leak, orphan_holding_memory",
        [f["kind"] for f in leaks(orphan["pid"])] == ["orphan_holding_memory"],
        describe(orphan["pid"]),
    )
check("launcher: no leak", not leaks(launcher["pid"]), describe(launcher["pid"]))

oom = facts("oom")[0]
found = leaks(oom["pid"])
check("oom: exactly one leak, an oom", [f["kind"] for f in found] == ["oom"], describe(oom["pid"]))
found = [f for f in found if f["kind"] == "oom"]
if found:
    finding = found[0]
    check(
        "oom: at the failing request's line",
        (finding.get("user_frame") or {}).get("line") == oom["request_line"],
        where(finding),
    )
    check("oom: diagnosis fragmentation", finding.get("diagnosis") == "fragmentation", finding.get("diagnosis"))
    failing = next((p for p in finding.get("processes", []) if p["pid"] == oom["pid"]), {})
    check(
        "oom: the failing process's allocated and reserved bytes are memory_stats()'s",
        (failing.get("allocated"), failing.get("reserved")) == (oom["allocated_bytes"], oom["reserved_bytes"]),
        f"{(failing.get('allocated'), failing.get('reserved'))} vs {(oom['allocated_bytes'], oom['reserved_bytes'])}",
    )
    postmortem = finding.get("postmortem") or {}
    check("oom: the finding names its post-mortem", bool(postmortem.get("recording")), postmortem)
    recording = postmortem.get("recording", "")
    jsonl = os.path.join(work, "postmortems", os.path.basename(recording).replace(".gpuprof", ".jsonl"))
    if os.path.exists(jsonl):
        events = [json.loads(line) for line in open(jsonl)]
        mine = [e for e in events if e["pid"] == oom["pid"]]
        live = {}
        allocator_segments = set()
        for event in mine:
            if event["layer"] != "driver" or event.get("result", 0) != 0:
                continue
            if event["op"] in ("alloc", "map") and event.get("kind") in ("device", "vmm"):
                if event["op"] == "alloc" and event.get("kind") == "vmm":
                    continue
                live[event["addr"]] = event["size"]
                if event.get("allocator_segment"):
                    allocator_segments.add(event["addr"])
            elif event["op"] in ("free", "unmap"):
                live.pop(event["addr"], None)
        segments = {addr: size for addr, size in live.items() if addr in allocator_segments}
        reserved = sum(segments.values())
        failed = [e for e in mine if e["layer"] == "driver" and e["op"] == "alloc" and e.get("result") == 2]
        span = (mine[-1]["ts"] - mine[0]["ts"]) / 1e9 if mine else 0
        reports = [e for e in mine if e["layer"] == "allocator"]
        last = reports[-1] if reports else {}
        # At the failure (the allocator's report, where the post-mortem ends) against
        # torch.cuda.memory_stats() in the except block that caught the OutOfMemoryError.
        check(
            "post-mortem: it ends with PyTorch's own out-of-memory report",
            last.get("api") == "c10::reportOutOfMemoryToProfiler" and last.get("result") == 2,
            last.get("api"),
        )
        check(
            "post-mortem: its replayed allocator segments at the failure are memory_stats()'s reserved bytes",
            reserved == oom["reserved_bytes"] and len(segments) == oom["segments"],
            f"{reserved} in {len(segments)} vs {oom['reserved_bytes']} in {oom['segments']}",
        )
        check(
            "post-mortem: the allocator's totals at the failure are memory_stats()'s",
            (last.get("allocated"), last.get("reserved")) == (oom["allocated_bytes"], oom["reserved_bytes"]),
            f"{(last.get('allocated'), last.get('reserved'))} vs {(oom['allocated_bytes'], oom['reserved_bytes'])}",
        )
        print(f"     outside the allocator: {sum(live.values()) - reserved} bytes (cuBLAS's workspace)")
        check("post-mortem: holds the failed request", bool(failed), [(e["size"], e["result"]) for e in failed][:3])
        print(
            f"     post-mortem: {len(mine)} events of pid {oom['pid']} over {span:.1f} s; "
            f"tensor events {sum(e['layer'] == 'allocator' for e in mine)}"
        )
    report = os.path.join(work, "oom-report.html")
    size = os.path.getsize(report) if os.path.exists(report) else 0
    check("post-mortem: the collector serves its HTML report", size > 10_000, f"{size} bytes")

extra = [f for f in findings if f["severity"] == "leak"]
expected = 2 + 2 + 2 + 1  # two growths, two workers, two orphans, one oom
check(
    "one leak per problem and process, no other",
    len(extra) == expected,
    f"{len(extra)} leaks: {[(f['pid'], f['kind']) for f in extra]}",
)
print(f"{sum(checks)} of {len(checks)} checks ok")
