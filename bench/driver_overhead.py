#!/usr/bin/env python3
"""Added time per cuMemAlloc_v2 + cuMemFree_v2 pair under `gpuprof attach`, as a ratio to bare
uprobes (empty bpftrace uprobe + uretprobe on the same two functions), measured in the same run.

    sudo python3 bench/driver_overhead.py [--pairs 20000] [--rounds 5]

Needs: cc, bpftrace, a built gpuprof (target/release/gpuprof; `cargo build --release`).
Rounds interleave the three modes so drift on the machine hits them alike; medians are reported.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import standins

ROOT = Path(__file__).resolve().parent.parent


def build(workdir):
    lib = standins.libcuda(workdir / "standin")
    program = standins.program("workloads/ipc_fork.c", workdir / "ipc_fork", "-ldl")
    return lib, program


def start_workload(program, lib, pairs):
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib.parent))
    env.pop("GPUPROF_WORKLOAD_LOG", None)
    proc = subprocess.Popen(
        [program, "loop", str(pairs)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def finish_workload(proc):
    proc.stdin.write("go\n")
    proc.stdin.flush()
    result = json.loads(proc.stdout.readline())
    assert proc.wait() == 0
    return result["ns_per_pair"]


def wait_for(stream, pattern):
    seen = []
    while True:
        line = stream.readline()
        if not line:
            raise RuntimeError(f"never saw {pattern!r}: {seen}")
        seen.append(line)
        if re.search(pattern, line):
            return seen


def run_bare(program, lib, pairs):
    return finish_workload(start_workload(program, lib, pairs)), None


def run_bpftrace(program, lib, pairs):
    proc = start_workload(program, lib, pairs)
    probes = " ".join(f"uprobe:{lib}:{f} {{}} uretprobe:{lib}:{f} {{}}" for f in ("cuMemAlloc_v2", "cuMemFree_v2"))
    tracer = subprocess.Popen(["bpftrace", "-e", probes], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(tracer.stdout, r"Attaching 4 probes")
    time.sleep(1.0)  # bpftrace prints before it attaches
    ns = finish_workload(proc)
    tracer.terminate()
    tracer.wait()
    return ns, None


def run_gpuprof(gpuprof, program, lib, pairs):
    proc = start_workload(program, lib, pairs)
    agent = subprocess.Popen(
        [gpuprof, "attach", str(proc.pid), "--stats", "--output", "/dev/null"], stderr=subprocess.PIPE, text=True
    )
    wait_for(agent.stderr, r"capturing pid")
    ns = finish_workload(proc)
    tail = agent.stderr.read()
    assert agent.wait() == 0, tail
    # The counters at the end (--stats): the last of the lines it prints.
    counters = [line for line in tail.splitlines() if " events (" in line and "; lost " in line][-1]
    events = int(re.search(r"(\d+) events", counters).group(1))
    lost = int(re.search(r"lost (\d+)", counters).group(1))
    return ns, (events, lost)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gpuprof", default=str(ROOT / "target" / "release" / "gpuprof"))
    args = parser.parse_args()
    if not Path("/sys/kernel/tracing/uprobe_events").exists():
        subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], check=True)

    with tempfile.TemporaryDirectory() as tmp:
        lib, program = build(Path(tmp))
        results = {"bare": [], "bpftrace": [], "gpuprof": []}
        captured = []
        for _ in range(args.rounds):
            results["bare"].append(run_bare(program, lib, args.pairs)[0])
            results["bpftrace"].append(run_bpftrace(program, lib, args.pairs)[0])
            ns, counts = run_gpuprof(args.gpuprof, program, lib, args.pairs)
            results["gpuprof"].append(ns)
            captured.append(counts)

    median = {mode: statistics.median(values) for mode, values in results.items()}
    floor = median["bpftrace"] - median["bare"]
    added = median["gpuprof"] - median["bare"]
    print(f"{args.pairs} alloc+free pairs ({2 * args.pairs} driver events) per round, {args.rounds} rounds, medians")
    print(f"{'mode':<42} {'ns/pair':>10} {'added ns/pair':>14}")
    print(f"{'no probes':<42} {median['bare']:>10.0f} {0:>14.0f}")
    print(f"{'bare uprobes (empty bpftrace, 2 fn x 2)':<42} {median['bpftrace']:>10.0f} {floor:>14.0f}")
    print(f"{'gpuprof attach (capture + decode + jsonl)':<42} {median['gpuprof']:>10.0f} {added:>14.0f}")
    print(f"gpuprof added cost / bare uprobe cost: {added / floor:.2f}x")
    print("gpuprof events per round (driver + exit), lost: " + ", ".join(f"{e}/{lost}" for e, lost in captured))
    print("raw ns/pair: " + json.dumps(results))
    expected = 2 * args.pairs + 1
    if any(e != expected or lost != 0 for e, lost in captured):
        sys.exit(f"expected {expected} events and none lost in every round")


if __name__ == "__main__":
    main()
