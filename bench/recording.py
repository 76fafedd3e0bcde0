#!/usr/bin/env python3
"""Recordings against jsonl, in the same run, on a training job's rate:

1. Capture: two training-like processes through the stand-ins (38-frame Python stacks, about
   100,000 allocator events a second between them) under `gpuprof run`, once writing a recording
   and once writing jsonl (the format the landed build wrote; with --baseline, also the landed
   build itself): events lost, the agent's CPU per event (its events a second on one core).
2. Size: the recording's events exported to jsonl and to a plain recording — the same events in
   each format: bytes an event.
3. Exports: report, summary, folded (at the peak and at the end), flamegraph, speedscope,
   memory-viz and jsonl of a recording with millions of
   events (the capture above, repeated with --copies), their time and peak memory per million
   events; with --baseline, the landed build's exports of the same events as jsonl.

    sudo python3 bench/recording.py [--seconds 10] [--copies 4] [--baseline PATH/TO/OLD/gpuprof]

Needs: cc, a release build (cargo build --release -p gpuprof).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import standins

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "testkit" / "fixtures"
GPUPROF = ROOT / "target" / "release" / "gpuprof"


def build(workdir):
    standins.libcuda(workdir)
    c10 = standins.shared("libc10_standin.c", workdir / "libc10.so")
    return dict(os.environ, LD_LIBRARY_PATH=str(workdir), GPUPROF_LIBC10=str(c10))


# A small parent forks and execs the command and reports its peak with wait4: a child started
# straight from this (large) process would be charged this process's memory until its exec.
MEASURE = """import os, sys, time
start = time.monotonic()
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write(f"{os.waitstatus_to_exitcode(status)} {time.monotonic() - start} {usage.ru_maxrss}")
"""


def measured(argv, env=None, stdout=subprocess.DEVNULL, may_fail=False):
    """Runs argv; returns (seconds, peak resident MiB, stderr)."""
    with tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile("r") as facts:
        subprocess.run([sys.executable, "-c", MEASURE, facts.name, *map(str, argv)], env=env, stdout=stdout, stderr=err)
        code, seconds, peak_kib = facts.read().split()
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if int(code) != 0:
        if may_fail:
            return None, int(peak_kib) / 1024, stderr
        sys.exit(f"{argv[:3]} failed: {stderr[-2000:]}")
    return float(seconds), int(peak_kib) / 1024, stderr


def capture(gpuprof, output, env, seconds):
    training = f"{sys.executable} {FIXTURES / 'workloads' / 'training.py'} --seconds {seconds} --depth 9 --rate 0"
    _, _, stderr = measured(
        [gpuprof, "run", "--stats", "--output", output, "--", "sh", "-c", f"{training} & {training} & wait"], env=env
    )
    # The counters at the end: the last of the lines --stats prints.
    line = [s for s in stderr.splitlines() if " events (" in s and "lost" in s][-1]
    events = int(re.search(r"gpuprof: (\d+) events", line).group(1))
    rate = float(re.search(r"events \((\d+)/s\)", line).group(1))
    lost = int(re.search(r"lost (\d+)", line).group(1))
    cpu = re.search(r"agent CPU ([\d.]+) s", line)
    return {"events": events, "rate": rate, "lost": lost, "cpu_s": float(cpu.group(1)) if cpu else None}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument(
        "--copies", type=int, default=4, help="the capture repeated this many times for the export figures"
    )
    parser.add_argument("--baseline", help="the landed build's gpuprof, to compare its jsonl capture and exports")
    args = parser.parse_args()
    # Gigabytes of jsonl go here: removed at the end, whatever happens.
    work = Path(tempfile.mkdtemp(prefix="gpuprof-bench-recording-"))
    try:
        run_all(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_all(args, work):
    env = build(work)
    results = {}

    # 1. Capture, interleaved.
    runs = [("recording", GPUPROF, work / "run.gpuprof"), ("jsonl", GPUPROF, work / "run.jsonl")]
    if args.baseline:
        runs.append(("jsonl, landed build", Path(args.baseline), work / "baseline.jsonl"))
    for name, binary, output in runs:
        results[name] = capture(binary, output, env, args.seconds)
        print(f"capture {name}: {results[name]}", flush=True)

    # 2. The same events in each format.
    measured([GPUPROF, "export", "--input", work / "run.gpuprof", "--format", "jsonl", "--output", work / "same.jsonl"])
    measured(
        [
            GPUPROF,
            "export",
            "--input",
            work / "run.gpuprof",
            "--format",
            "recording",
            "--compress",
            "none",
            "--output",
            work / "plain.gpuprof",
        ]
    )
    measured(
        [GPUPROF, "export", "--input", work / "same.jsonl", "--format", "recording", "--output", work / "again.gpuprof"]
    )
    events = results["recording"]["events"]
    sizes = {
        "recording (zstd)": (work / "run.gpuprof").stat().st_size,
        "recording (plain)": (work / "plain.gpuprof").stat().st_size,
        "jsonl": (work / "same.jsonl").stat().st_size,
    }

    # 3. Exports of a long recording: the capture's events repeated, time shifted.
    long_jsonl = work / "long.jsonl"
    with open(work / "same.jsonl") as f:
        first = json.loads(f.readline())["ts"]
        for line in f:
            last = line
    span = json.loads(last)["ts"] - first + 1
    with open(long_jsonl, "w") as out:
        for copy in range(args.copies):
            with open(work / "same.jsonl") as lines:
                for line in lines:
                    # The time is the first field: shift it without parsing the rest.
                    head, rest = line.split(",", 1)
                    out.write(f'{{"ts":{int(head[6:]) + copy * span},{rest}')
    long_recording = work / "long.gpuprof"
    measured([GPUPROF, "export", "--input", long_jsonl, "--format", "recording", "--output", long_recording])
    long_events = events * args.copies
    exports = {
        "report": ["report", "--format", "json"],
        "folded": ["export", "--format", "folded"],
        # The peak (the default since) takes one more pass over the file than the end.
        "folded --end": ["export", "--format", "folded", "--end"],
        "flamegraph": ["export", "--format", "flamegraph", "--output", str(work / "f.svg")],
        "speedscope": ["export", "--format", "speedscope", "--output", str(work / "s.json")],
        "summary": ["summary", "--format", "json"],
        "memory-viz": ["export", "--format", "memory-viz", "--output", str(work / "s.pickle")],
        "jsonl": ["export", "--format", "jsonl", "--output", "/dev/null"],
    }
    timings = {}
    for name, argv in exports.items():
        seconds, peak, _ = measured([GPUPROF, *argv, "--input", long_recording])
        timings[name] = {"s_per_million": seconds * 1e6 / long_events, "peak_mib": peak}
        if args.baseline and name not in ("jsonl", "folded --end", "speedscope", "summary"):
            base_argv = [a.replace("f.svg", "b.svg").replace("s.pickle", "b.pickle") for a in argv]
            # The landed build loads every event: give it a tenth of the events, and at most 12 GiB.
            tenth = work / "tenth.jsonl"
            if not tenth.exists():
                with open(long_jsonl) as src, open(tenth, "w") as dst:
                    for i, line in enumerate(src):
                        if i >= long_events // 10:
                            break
                        dst.write(line)
            seconds, peak, _ = measured(
                ["prlimit", "--as=12884901888", args.baseline, *base_argv, "--input", tenth], may_fail=True
            )
            n = long_events // 10
            timings[name]["landed_build_on_jsonl"] = (
                {"s_per_million": seconds * 1e6 / n, "peak_mib_per_million": peak * 1e6 / n, "events": n}
                if seconds is not None
                else {"failed": f"out of its 12 GiB after {peak:.0f} MiB", "events": n}
            )
        print(f"export {name}: {timings[name]}", flush=True)

    print(
        json.dumps(
            {
                "capture": results,
                "bytes_per_event": {k: v / events for k, v in sizes.items()},
                "events": events,
                "long_events": long_events,
                "long_recording_bytes": long_recording.stat().st_size,
                "exports": timings,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
