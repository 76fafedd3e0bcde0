#!/usr/bin/env python3
"""CPU the in-process shim costs a process: paced allocator reports (bursts of 1,000 every 10 ms,
as a training loop makes them, 33 Python frames deep) through the libc10 stand-ins, with no
shim and with the shim preloaded (events to /dev/null), or with two shim builds to compare.
Same run, interleaved rounds, medians of the processes' user+system CPU and wall time.

    python3 bench/shim_cpu.py SHIM.so [OTHER_SHIM.so] [--rounds 5] [--bursts 50]

The stand-ins are built by the tests (`cargo test -p gpuprof-shim --test shim` leaves them in
target/tmp/fixtures/torch_lib).
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STANDINS = ROOT / "target/tmp/fixtures/torch_lib"

WORKLOAD = textwrap.dedent("""
    import ctypes, os, sys, time
    class Device(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int8), ("index", ctypes.c_int8)]
    ctypes.CDLL(os.environ["GPUPROF_LIBC10"])
    report = ctypes.CDLL(os.environ["GPUPROF_LIBC10_CUDA"]).standin_allocator_report
    report.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t, ctypes.c_size_t, Device]
    def nested(depth, bursts):
        if depth:
            return nested(depth - 1, bursts)
        cuda = Device(1, 0)
        for _ in range(bursts):
            for i in range(1000):
                report(0x7f0000000000 + (i % 64) * 4096, 4096 if i % 2 == 0 else -4096, 4096 * (i % 2), 1 << 21, cuda)
            time.sleep(0.01)
    nested(30, int(sys.argv[1]))
""")


def measure(shim, bursts):
    env = dict(
        os.environ, GPUPROF_LIBC10=str(STANDINS / "libc10.so"), GPUPROF_LIBC10_CUDA=str(STANDINS / "libc10_cuda.so")
    )
    if shim:
        env.update(LD_PRELOAD=shim, GPUPROF_SHIM_OUTPUT="/dev/null")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", WORKLOAD, str(bursts)], env=env, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("shims", nargs="+")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bursts", type=int, default=50)
    args = parser.parse_args()
    modes = [("plain", None)] + [(Path(s).name if len(args.shims) == 1 else s, s) for s in args.shims]
    results = {name: [] for name, _ in modes}
    for _ in range(args.rounds):
        for name, shim in modes:
            results[name].append(measure(shim, args.bursts))
    events = args.bursts * 1000
    plain_cpu = statistics.median(c for c, _ in results["plain"])
    plain_wall = statistics.median(w for _, w in results["plain"])
    print(f"{events} allocator reports, 33 frames deep, paced; {args.rounds} rounds, medians")
    print(f"{'mode':<40} {'cpu s':>7} {'added µs/report':>16} {'wall s':>7} {'wall vs plain':>14}")
    for name, _ in modes:
        cpu = statistics.median(c for c, _ in results[name])
        wall = statistics.median(w for _, w in results[name])
        print(f"{name:<40} {cpu:7.3f} {(cpu - plain_cpu) / events * 1e6:16.2f} {wall:7.3f} {wall / plain_wall:13.3f}x")


main()
