#!/usr/bin/env python3
"""The HTML report at a training job's rate: captures of two training-like processes through the
stand-ins (38-frame Python stacks, ~100,000 allocator events a second between them) of growing
length, up to --events (10 million by default: a real capture of that many, not a repeated one),
and for each:

1. `export --format html`: time and peak memory per million events, against `export --format
   flamegraph` (the peak view, two passes as well) of the same file in the same run; the page's
   size, per million events;
2. the page in headless Chromium (testkit/fixtures/browse_report.py): how long from navigation until
   it is drawn and usable, and how long picking an instant and a range take once it is.

    sudo python3 bench/html_report.py [--events 10000000] [--out DIR]

Needs: cc, chromium, a release build (cargo build --release -p gpuprof).
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recording  # noqa: E402  (the stand-ins' build, the measured runs, the training capture)

ROOT = Path(__file__).resolve().parent.parent
GPUPROF = ROOT / "target" / "release" / "gpuprof"
BROWSE = ROOT / "testkit" / "fixtures" / "browse_report.py"

# Picking, once the page is up: the time each takes, measured in the page.
TIMED = """(() => {
  const r = window.gpuprofReport, span = r.data.span / 1e9, times = [];
  for (const share of [0.1, 0.3, 0.5, 0.7, 0.9]) {
    const a = performance.now(); r.pick(span * share); times.push(performance.now() - a);
  }
  const a = performance.now(); r.pickRange(span * 0.2, span * 0.8); times.push(performance.now() - a);
  return { pick_ms: times.slice(0, 5), range_ms: times[5],
           curves: r.data.curves.length, points: r.data.curves.reduce((n, c) => n + c.t.length, 0),
           snapshots: r.data.snapshots.length, stack_nodes: r.data.stacks.parent.length };
})()"""


def page_figures(page, steps_file):
    steps_file.write_text(json.dumps([{"eval": TIMED}]))
    out = subprocess.run([sys.executable, BROWSE, page, steps_file], capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    if report["errors"]:
        sys.exit(f"{page}: the page threw {report['errors']}")
    return {
        "ready_ms": round(report["ready_ms"]),
        "ready_wall_ms": round(report["ready_wall_ms"]),
        **report["results"][0],
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=10_000_000, help="events in the longest capture")
    parser.add_argument("--out", help="keep the recordings and pages here")
    args = parser.parse_args()
    work = Path(args.out or tempfile.mkdtemp(prefix="gpuprof-bench-html-"))
    work.mkdir(parents=True, exist_ok=True)
    env = recording.build(work)
    results = []
    seconds, rate = 2, None
    while True:
        run = work / f"run-{seconds}s.gpuprof"
        captured = recording.capture(GPUPROF, run, env, seconds)
        events = captured["events"]
        page = work / f"run-{seconds}s.html"
        html_s, html_mib, _ = recording.measured(
            [GPUPROF, "export", "--input", run, "--format", "html", "--output", page]
        )
        flame_s, flame_mib, _ = recording.measured(
            [GPUPROF, "export", "--input", run, "--format", "flamegraph", "--output", work / "f.svg"]
        )
        row = {
            "seconds": seconds,
            "events": events,
            "lost": captured["lost"],
            "recording_bytes": run.stat().st_size,
            "html_bytes": page.stat().st_size,
            "html_export_s": round(html_s, 2),
            "html_export_peak_mib": round(html_mib, 1),
            "flamegraph_export_s": round(flame_s, 2),
            "flamegraph_export_peak_mib": round(flame_mib, 1),
            **page_figures(page, work / "steps.json"),
        }
        results.append(row)
        print(json.dumps(row), flush=True)
        if events >= args.events:
            break
        rate = events / seconds
        # Next: ten times longer, or what reaches the target at the rate seen.
        seconds = min(seconds * 10, int(args.events / rate * 1.08) + 1)
    print(json.dumps({"results": results}, indent=1))


if __name__ == "__main__":
    main()
