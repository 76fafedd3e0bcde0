#!/usr/bin/env python3
"""Cost of the Python stack walk: a CPython process 32 frames deep making cuMemAlloc_v2 +
cuMemFree_v2 pairs (through ctypes, against the libcuda stand-in), timed with no probes, with
bare uprobes (empty bpftrace programs on the same two functions), under `gpuprof attach
--no-stacks`, and under `gpuprof attach` (stacks walked and symbolized). Same run, interleaved
rounds, medians.

    sudo python3 bench/stack_walk.py [--pairs 20000] [--rounds 5] [--python PATH]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import standins

ROOT = Path(__file__).resolve().parent.parent
DEPTH = 32

WORKLOAD = textwrap.dedent(f"""
    import ctypes, sys, time
    lib = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    assert lib.cuInit(0) == 0
    assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert lib.cuCtxSetCurrent(ctx) == 0
    alloc, free = lib.cuMemAlloc_v2, lib.cuMemFree_v2
    alloc.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    free.argtypes = [ctypes.c_uint64]

    def loop(pairs):
        ptr = ctypes.c_uint64()
        print("ready", flush=True)
        sys.stdin.readline()
        start = time.perf_counter_ns()
        for _ in range(pairs):
            alloc(ctypes.byref(ptr), 1 << 20)
            free(ptr.value)
        print(json_dumps((time.perf_counter_ns() - start) / pairs), flush=True)

    def json_dumps(ns):
        return '{{"ns_per_pair": %.1f}}' % ns

    def descend(depth, pairs):
        # <module> + descend * n + loop = {DEPTH} frames at the calls
        if depth == 0:
            return loop(pairs)
        return descend(depth - 1, pairs)

    descend({DEPTH - 2}, int(sys.argv[1]))
""")


def start(python, lib_dir, script, pairs):
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib_dir))
    proc = subprocess.Popen(
        [python, script, str(pairs)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def finish(proc):
    proc.stdin.write("go\n")
    proc.stdin.flush()
    ns = json.loads(proc.stdout.readline())["ns_per_pair"]
    proc.stdin.close()
    assert proc.wait() == 0
    return ns


def wait_for(stream, pattern):
    seen = []
    for line in stream:
        seen.append(line)
        if re.search(pattern, line):
            return
    raise RuntimeError(f"never saw {pattern!r}: {seen}")


def run(mode, gpuprof, python, lib, script, pairs):
    proc = start(python, lib.parent, script, pairs)
    tracer = None
    if mode == "bpftrace":
        probes = " ".join(f"uprobe:{lib}:{f} {{}} uretprobe:{lib}:{f} {{}}" for f in ("cuMemAlloc_v2", "cuMemFree_v2"))
        tracer = subprocess.Popen(
            ["bpftrace", "-e", probes], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        wait_for(tracer.stdout, r"Attaching 4 probes")
        time.sleep(1.0)
    elif mode.startswith("gpuprof"):
        extra = ["--no-stacks"] if mode == "gpuprof --no-stacks" else []
        log = tempfile.NamedTemporaryFile("w+", suffix=".log")
        tracer = subprocess.Popen([gpuprof, "attach", str(proc.pid), "--output", "/dev/null", *extra], stderr=log)
        while "capturing pid" not in Path(log.name).read_text():
            time.sleep(0.01)
    ns = finish(proc)
    tail = ""
    if mode == "bpftrace":
        tracer.terminate()
        tracer.wait()
    elif tracer:
        assert tracer.wait() == 0
        tail = Path(log.name).read_text()
    return ns, tail


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--gpuprof", default=str(ROOT / "target" / "release" / "gpuprof"))
    args = parser.parse_args()
    if not Path("/sys/kernel/tracing/uprobe_events").exists():
        subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], check=True)
    modes = ["no probes", "bpftrace", "gpuprof --no-stacks", "gpuprof"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        lib = standins.libcuda(tmp / "standin")
        script = tmp / "workload.py"
        script.write_text(WORKLOAD)
        results = {mode: [] for mode in modes}
        tails = []
        for _ in range(args.rounds):
            for mode in modes:
                ns, tail = run(mode, args.gpuprof, args.python, lib, script, args.pairs)
                results[mode].append(ns)
                if mode == "gpuprof":
                    tails.append(tail.strip().splitlines()[-1])
    median = {mode: statistics.median(v) for mode, v in results.items()}
    base = median["no probes"]
    added = {mode: median[mode] - base for mode in modes}
    version = subprocess.run(
        [args.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True
    ).stdout.strip()
    print(
        f"CPython {version}, {DEPTH} Python frames at each call, {args.pairs} alloc+free pairs per round, {args.rounds} rounds, medians"
    )
    print(f"{'mode':<28} {'ns/pair':>10} {'added ns/pair':>14}")
    for mode in modes:
        print(f"{mode:<28} {median[mode]:>10.0f} {added[mode]:>14.0f}")
    walk = added["gpuprof"] - added["gpuprof --no-stacks"]
    print(f"stack walk + symbolization: {walk / 2:.0f} ns per event ({DEPTH} frames)")
    print(f"gpuprof with stacks / without, added cost: {added['gpuprof'] / added['gpuprof --no-stacks']:.2f}x")
    print(f"gpuprof with stacks / bare uprobes, added cost: {added['gpuprof'] / added['bpftrace']:.2f}x")
    print(f"whole call with stacks / without: {median['gpuprof'] / median['gpuprof --no-stacks']:.2f}x")
    print("last line of gpuprof with stacks, per round:")
    for tail in tails:
        print("  " + tail)
    print("raw ns/pair: " + json.dumps(results))


if __name__ == "__main__":
    main()
