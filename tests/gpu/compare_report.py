"""Reads back the HTML reports validate_report.sh made on the GPU machine, in headless Chromium
here (testkit/fixtures/browse_report.py): the loop's allocated and reserved curves at each instant
PyTorch's counters were sampled against those counters, its peak against allocated_bytes.all.peak,
the driver curve against NVML's per-process memory; the out-of-memory report's failure, findings
and curves at the failure against the numbers in PyTorch's OutOfMemoryError. Takes screenshots.

    python3 tests/gpu/compare_report.py OUT [SCREENSHOT_DIR [GPUPROF]]
"""
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
BROWSE = ROOT / "testkit" / "fixtures" / "browse_report.py"
out = Path(sys.argv[1])
shots = Path(sys.argv[2]) if len(sys.argv) > 2 else out
GiB, MiB = 1 << 30, 1 << 20
ok = True


def check(label, good, detail=""):
    global ok
    ok &= bool(good)
    print(f"{'ok  ' if good else 'FAIL'} {label} {detail}")


def browse(page, steps):
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(steps, f)
        f.flush()
        run = subprocess.run([sys.executable, BROWSE, page, f.name], capture_output=True, text=True)
    if run.returncode:
        sys.exit(run.stderr)
    report = json.loads(run.stdout)
    check(f"{page.name}: no script errors, no request but the page", not report["errors"] and len(report["requests"]) == 1, report["errors"])
    print(f"     {page.name}: ready {report['ready_ms']:.0f} ms after navigation")
    return report["results"]


READOUT = ("Array.from(document.querySelectorAll('#readout tbody tr'))"
           ".map(r => [r.dataset.pid, r.dataset.metric, r.dataset.device, r.dataset.bytes === '' ? null : Number(r.dataset.bytes)])")


def curves_at(page, instants):
    steps = [{"eval": "window.gpuprofReport.data.first_ts"}, {"eval": "window.gpuprofReport.data.peak"}]
    for ts in instants:
        steps.append({"eval": f"(() => {{ const r = window.gpuprofReport; r.pick(({ts} - r.data.first_ts) / 1e9); return {READOUT}; }})()"})
    results = browse(page, steps)
    return results[0], results[1], results[2:]


GPUPROF = Path(sys.argv[3]) if len(sys.argv) > 3 else ROOT / "target" / "release" / "gpuprof"


def recorded_totals(recording, instants, pids, relative=False):
    """The capture's own totals at each instant (ns since the epoch, or since the first event when
    `relative`: a page's times, exact where its first_ts, read by JavaScript, is not), per pid: the
    allocator's last reported (allocated, reserved) and the live driver allocations of device
    memory."""
    stream = subprocess.Popen([GPUPROF, "export", str(recording), "-f", "jsonl"], stdout=subprocess.PIPE, text=True)
    instants = sorted(instants)
    totals, live, out, at, first = {}, {}, {}, 0, None
    for line in stream.stdout:
        e = json.loads(line)
        first = e["ts"] if first is None else first
        while at < len(instants) and e["ts"] - (first if relative else 0) > instants[at]:
            out[instants[at]] = {p: (totals.get(p), sum(live.get(p, {}).values())) for p in pids}
            at += 1
        pid = e["pid"]
        if e.get("allocated") is not None:
            totals[pid] = (e["allocated"], e["reserved"])
        if e["layer"] == "process" and e["op"] == "exit":
            totals[pid] = (0, 0)
            live.pop(pid, None)
        if e["layer"] == "driver" and e.get("result", 0) == 0 and e.get("addr") and e.get("kind") != "host_pinned":
            if e["op"] == "alloc":
                live.setdefault(pid, {})[e["addr"]] = e["size"]
            elif e["op"] == "free":
                live.setdefault(pid, {}).pop(e["addr"], None)
    stream.wait()
    for instant in instants[at:]:
        out[instant] = {p: (totals.get(p), sum(live.get(p, {}).values())) for p in pids}
    return out


def at_every_kept_instant(name, page, recording, pids):
    """The page's curves, read where it keeps the stacks, against the capture's totals there."""
    steps = [{"eval": f"""(() => {{ const r = window.gpuprofReport, out = [];
        for (const s of r.data.snapshots) {{ r.pick(s.t / 1e9); out.push([s.t, {READOUT}]); }} return out; }})()"""}]
    readouts = browse(page, steps)[0]
    expected = recorded_totals(recording, [t for t, _ in readouts], pids, relative=True)
    same = 0
    for t, rows in readouts:
        want = expected[t]
        got = {p: ({m: v for q, m, _, v in rows if q == str(p)}) for p in pids}
        good = all(
            (got[p].get("allocated"), got[p].get("reserved")) == (want[p][0] or (None, None)) and (got[p].get("driver") or 0) == want[p][1]
            for p in pids)
        same += good
        if not good:
            print(f"     {name} at {t / 1e9:.3f} s: page {got} capture {want}")
    check(f"{name}: the curves equal the capture's totals at {same} of {len(readouts)} instants kept", same == len(readouts))
    return readouts


# The loop: the curves where the report keeps stacks; the capture against PyTorch's counters.
facts = json.loads((out / "loop.facts.json").read_text())
pid = facts["pid"]
at_every_kept_instant("loop", out / "loop.html", out / "loop.gpuprof", [pid])
captured = recorded_totals(out / "loop.gpuprof", [s["ts"] for s in facts["samples"]], [pid])
matched = sum(captured[s["ts"]][pid][0] == (s["allocated"], s["reserved"]) for s in facts["samples"])
check(f"loop: the capture's allocated and reserved equal PyTorch's at {matched} of {len(facts['samples'])} samples", matched == len(facts["samples"]))
peak = browse(out / "loop.html", [{"eval": "window.gpuprofReport.data.peak"}])[0]
check(f"loop peak {peak['bytes']} = allocated_bytes.all.peak", peak["bytes"] == facts["peak_allocated"], str(facts["peak_allocated"]))

# NVML: the process's memory against the driver curve (NVML adds the context and modules).
nvml = []
for line in (out / "loop.nvml").read_text().splitlines():
    ts, _, apps = line.partition(" ")
    for app in filter(None, apps.split(";")):
        app_pid, used = [x.strip() for x in app.split(",")]
        if app_pid == str(pid) and used.isdigit():
            nvml.append((int(ts), int(used) * MiB))
if nvml:
    captured = recorded_totals(out / "loop.gpuprof", [ts for ts, _ in nvml], [pid])
    gaps = [(used - captured[ts][pid][1]) / MiB for ts, used in nvml if captured[ts][pid][1]]
    if gaps:
        check(f"loop: NVML minus the driver allocations over {len(gaps)} samples: {min(gaps):.0f}–{max(gaps):.0f} MiB (the context and modules)",
              all(0 <= g < 1024 for g in gaps))

# The out-of-memory run.
lines = [json.loads(s) for s in (out / "oom.facts.jsonl").read_text().splitlines() if s.startswith("{")]
evaluator = next(f for f in lines if f["role"] == "evaluator")
neighbour = next(f for f in lines if f["role"] == "neighbour")
message = evaluator["oom"]
print(f"     PyTorch said: {message[:400]}")
results = browse(out / "oom.html", [
    {"eval": "window.gpuprofReport.data.findings.map(f => [f.kind, f.pid, f.bytes, f.user_frame ? f.user_frame.file.split('/').pop() + ':' + f.user_frame.line : '', f.t])"},
    {"eval": "window.gpuprofReport.data.markers.filter(m => m.kind === 'oom').map(m => m.t)"},
    {"click_selector": "#findings tbody tr[data-kind='oom']"},
    {"eval": READOUT},
    {"eval": "Array.from(document.querySelectorAll('#top-stacks tbody tr')).slice(0, 3).map(r => [r.dataset.pid, Number(r.dataset.bytes), r.dataset.userLine])"},
    {"screenshot": str(shots / "report-oom.png"), "height": 1250},
])
findings, ooms, _, rows, top = results[0], results[1], results[2], results[3], results[4]
at_every_kept_instant("oom", out / "oom.html", out / "oom.gpuprof", [evaluator["pid"], neighbour["pid"]])
for f in findings:
    print(f"     finding {f}")
oom = [f for f in findings if f[0] == "oom"]
check("oom: one failure marked, one oom finding in the evaluator", len(ooms) == 1 and len(oom) == 1 and oom[0][1] == evaluator["pid"])
allocated = {metric: value for p, metric, _, value in rows if p == str(evaluator["pid"])}
said = re.search(r"this process has ([\d.]+) GiB memory in use. Of the allocated memory ([\d.]+) GiB is allocated by PyTorch, and ([\d.]+) (GiB|MiB|KiB|B) is reserved", message)
if said:
    torch_allocated = float(said.group(2)) * GiB
    check(f"oom: allocated at the failure {(allocated.get('allocated') or 0) / GiB:.2f} GiB = PyTorch's {said.group(2)} GiB",
          abs((allocated.get("allocated") or 0) - torch_allocated) < 0.01 * GiB)
neighbour_rows = {metric: value for p, metric, _, value in rows if p == str(neighbour["pid"])}
check(f"oom: the neighbour's reserved at the failure {(neighbour_rows.get('reserved') or 0) / GiB:.2f} GiB = its own {neighbour['reserved'] / GiB:.2f} GiB",
      neighbour_rows.get("reserved") == neighbour["reserved"])
for row in top:
    print(f"     top stack at the failure: {row}")
check("oom: the evaluator's forward line holds the most at the failure", any("torch_stories.py" in r[2] for r in top[:2]), str(top[:2]))

browse(out / "loop.html", [{"screenshot": str(shots / "report-loop.png"), "height": 1250}])
sys.exit(0 if ok else 1)
