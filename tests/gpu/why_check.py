"""What gpuprof found for one why_*.py job beside what the job says of itself, and whether the
findings are the ones the job expects (tests/gpu/validate_why.sh). Needs no torch.

    why_check.py show NAME DIR          # DIR/NAME.facts, NAME.report.json, NAME.live.json, NAME.w1.json
    why_check.py collect DIR OUT NAME…  # OUT/why_findings.json and OUT/why_facts.json

`show` prints one line per finding (kind, severity, diagnosis, rank, the user's file:line, bytes,
seconds_to_full, pid) with the first 300 characters of its sentence, the jobs' facts, and one
CHECK line per set of findings: `report` (`gpuprof report -f json` of the jsonl, the defaults),
`live` (`run --findings`), `w1` (a report at 1 s windows, for reference). A rank is checked in
each: a file keeps the rank the live capture read.
"""
import json
import os
import sys

MiB = 1 << 20


def load(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        return default if not os.path.exists(path) else {"unreadable": f"{path}: {error}"}


def facts_of(path):
    """The JSON lines of a job's standard output; the other lines as they are."""
    lines, other = [], []
    try:
        with open(path) as f:
            for text in f:
                text = text.strip()
                if text.startswith("{"):
                    try:
                        lines.append(json.loads(text))
                        continue
                    except ValueError:
                        pass
                if text:
                    other.append(text)
    except OSError as error:
        other.append(f"no facts: {error}")
    return lines, other


def mib(n):
    return "-" if n is None else f"{n / MiB:,.1f} MiB"


def finding_line(f):
    user = f.get("user_frame")
    where = f"{os.path.basename(user['file'])}:{user['line']} {user['function']}" if user else "-"
    rate = f.get("bytes_per_second")
    rate = f" rate {rate / MiB:,.1f} MiB/s" if rate else ""
    to_full = f.get("seconds_to_full")
    to_full = "-" if to_full is None else f"{to_full:,.1f}"
    return (f"  {f['kind']} {f.get('severity')} {f.get('diagnosis') or '-'} rank {f.get('rank', '-')} {where} "
            f"bytes {f['bytes']} ({mib(f['bytes'])}) seconds_to_full {to_full}{rate} pid {f['pid']}"
            f"\n      {f.get('detail', '')[:300]}")


def check(findings, processes):
    """What differs between `findings` and what the processes expect; [] when nothing does."""
    if not isinstance(findings, list):
        return [f"no findings to read ({findings})"]
    problems = []
    expected = set()
    for p in processes:
        for want in p.get("expect", []):
            expected.add((p["pid"], want["kind"]))
            got = [f for f in findings if f["pid"] == p["pid"] and f["kind"] == want["kind"]]
            label = f"{want['kind']} of pid {p['pid']}"
            if not got:
                problems.append(f"no {label} (want {want.get('diagnosis')} at line {want.get('line')})")
                continue
            if len(got) != want.get("count", len(got)) or (want["kind"] == "growth" and len(got) > 1):
                problems.append(f"{len(got)} {label} findings (want {want.get('count', 1)})")
            f = got[0]
            if f.get("diagnosis") != want.get("diagnosis"):
                problems.append(f"{label}: diagnosis {f.get('diagnosis')} (want {want.get('diagnosis')})")
            user = f.get("user_frame") or {}
            lines = want.get("lines", [want.get("line")])
            if user.get("line") not in lines or os.path.basename(user.get("file", "")) != os.path.basename(p["file"]):
                problems.append(f"{label}: at {os.path.basename(user.get('file', '-'))}:{user.get('line')} "
                                f"(want {os.path.basename(p['file'])}:{' or '.join(map(str, lines))}; "
                                f"other lines of the job {want.get('also', {})})")
            if "rank" in want and f.get("rank") != want["rank"]:
                problems.append(f"{label}: rank {f.get('rank')} (want {want['rank']})")
            if want.get("seconds_to_full") and f.get("seconds_to_full") is None:
                problems.append(f"{label}: no seconds_to_full")
            if "names_pid" in want and str(want["names_pid"]) not in f.get("detail", ""):
                problems.append(f"{label}: the sentence does not name pid {want['names_pid']}")
    for f in findings:
        if f.get("severity") == "leak" and (f["pid"], f["kind"]) not in expected:
            user = f.get("user_frame") or {}
            problems.append(f"unexpected {f['kind']} {f.get('diagnosis')} of pid {f['pid']} at "
                            f"{os.path.basename(user.get('file', '-'))}:{user.get('line')}")
    return problems


def show(name, folder):
    processes, other = facts_of(os.path.join(folder, f"{name}.facts"))
    print(f"-- {name}: what the job says of itself")
    for p in processes:
        extra = {k: p[k] for k in ("rank", "steps", "validations", "batches", "batch", "seconds", "seconds_to_oom",
                                   "kept_tensors", "free_at_start", "planned_bytes_per_second",
                                   "cached_bytes", "allocated_change_after_first_step") if k in p}
        print(f"  pid {p['pid']} {p['role']}: allocated {mib(p.get('allocated'))} reserved {mib(p.get('reserved'))} "
              f"peak allocated {mib(p.get('peak_allocated'))} peak reserved {mib(p.get('peak_reserved'))} "
              f"ooms {p.get('ooms')} kept {mib(p.get('kept_bytes'))} ({mib(p.get('kept_bytes_per_second'))}/s) {json.dumps(extra)}")
        if p.get("lines"):
            print(f"      lines of {os.path.basename(p['file'])}: {json.dumps(p['lines'])}")
        if p.get("oom"):
            print(f"      PyTorch: {p['oom'][:600]}")
        for want in p.get("expect", []):
            print(f"      expects {json.dumps({k: v for k, v in want.items() if k != 'also'})}")
    for text in other[:10]:
        print(f"  (stdout) {text[:300]}")
    expecting = [p for p in processes if "expect" in p]
    for kind, title in (("report", "gpuprof report -f json (defaults)"), ("live", "run --findings (live)"),
                        ("w1", "gpuprof report --growth-window 1 (not the defaults; for reference)")):
        path = os.path.join(folder, f"{name}.{kind}.json")
        if not os.path.exists(path):
            continue
        findings = load(path, [])
        print(f"-- {name}: {title}")
        if isinstance(findings, list):
            for f in sorted(findings, key=lambda f: (f.get("severity") != "leak", f["pid"], f.get("first_ts", 0))):
                print(finding_line(f))
            if not findings:
                print("  (no findings)")
        if not expecting:
            print(f"CHECK {name} {kind}: no facts from the job to check against")
            continue
        problems = check(findings, expecting)
        print(f"CHECK {name} {kind}: " + ("as expected" if not problems else "NOT as expected: " + "; ".join(problems)))


def collect(folder, out, names):
    findings, facts = {}, {}
    for name in names:
        findings[name] = {kind: load(os.path.join(folder, f"{name}.{kind}.json"), None)
                          for kind in ("report", "live", "w1")}
        facts[name] = facts_of(os.path.join(folder, f"{name}.facts"))[0]
    with open(os.path.join(out, "why_findings.json"), "w") as f:
        json.dump(findings, f, indent=1)
    with open(os.path.join(out, "why_facts.json"), "w") as f:
        json.dump(facts, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["show"] and len(sys.argv) == 4:
        show(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["collect"] and len(sys.argv) >= 4:
        collect(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(__doc__)
