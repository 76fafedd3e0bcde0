"""What backward attribution adds per allocator report, on this machine, through the libc10 and
libtorch_cpu stand-ins: a Python loop (20 frames deep) makes autograd nodes that each report a
forward block, and every 100 nodes a backward pass on the stand-in's autograd thread reports
each node's gradient (alloc and free): three reports per node. Interleaved rounds of: plain,
`gpuprof run --no-autograd`, `gpuprof run`, through eBPF or (`--via shim`) the in-process shim
(libgpuprof_shim.so next to gpuprof). The figure: attribution's added time per report as a share
of the capture's own added time per report (both measured in the same rounds).

    sudo python3 bench/autograd_overhead.py [--gpuprof target/release/gpuprof] [--via ebpf|shim] [--nodes 20000] [--rounds 3]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import standins

root = Path(__file__).resolve().parent.parent

WORKLOAD = r"""
import ctypes, os, sys, time
torch = ctypes.CDLL(os.environ["LIBTORCH_CPU"])
torch.gpuprof_standin_forward.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
nodes, pause = int(sys.argv[1]), float(sys.argv[2]) / 1000
time.sleep(0.5)  # gpuprof configures the process once libc10 is mapped

def deep(n):
    if n:
        return deep(n - 1)
    busy = 0.0
    start = time.perf_counter()
    for i in range(nodes):
        torch.gpuprof_standin_forward(0, 4096, 8192)
        if i % 100 == 99:
            torch.gpuprof_standin_backward()
            if pause:
                # Training rates, not a flood: the capture's queue drains between batches, and
                # only the time in the batches counts.
                busy += time.perf_counter() - start
                time.sleep(pause)
                start = time.perf_counter()
    print(busy + time.perf_counter() - start)

deep(20)
"""


def build(out):
    standins.shared("libc10_standin.c", out / "libc10.so")
    standins.shared(
        "libtorch_cpu_standin.c", out / "libtorch_cpu.so", f"-L{out}", "-lc10", "-Wl,-rpath,$ORIGIN", "-lpthread"
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpuprof", default=str(root / "target" / "release" / "gpuprof"))
    parser.add_argument("--nodes", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--via", choices=["ebpf", "shim"], default="ebpf")
    parser.add_argument("--pause-ms", type=float, default=0.0, help="sleep after every 100 nodes (not counted)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        build(tmp)
        (tmp / "workload.py").write_text(WORKLOAD)
        env = dict(os.environ, LIBTORCH_CPU=str(tmp / "libtorch_cpu.so"))
        command = [sys.executable, str(tmp / "workload.py"), str(args.nodes), str(args.pause_ms)]
        modes = {
            "plain": [],
            "gpuprof --no-autograd": [
                args.gpuprof,
                "run",
                "--via",
                args.via,
                "--no-autograd",
                "--output",
                "/dev/null",
                "--",
            ],
            "gpuprof": [args.gpuprof, "run", "--via", args.via, "--output", "/dev/null", "--"],
        }
        seconds = {name: [] for name in modes}
        for _ in range(args.rounds):
            for name, prefix in modes.items():
                out = subprocess.run([*prefix, *command], env=env, capture_output=True, text=True, check=True).stdout
                seconds[name].append(float(out.strip().splitlines()[-1]))
    reports = 3 * args.nodes
    us = {name: statistics.median(v) * 1e6 / reports for name, v in seconds.items()}
    print(
        f"{reports} allocator reports a run ({args.nodes} nodes, 20-frame stacks, {args.pause_ms} ms pause every 300 reports), "
        f"capture {args.via}, {args.rounds} rounds, medians"
    )
    for name in modes:
        print(f"{name:<24} {us[name]:8.2f} µs a report")
    capture = us["gpuprof --no-autograd"] - us["plain"]
    attribution = us["gpuprof"] - us["gpuprof --no-autograd"]
    print(
        f"capture added {capture:.2f} µs a report; attribution added {attribution:.2f} µs "
        f"({attribution / capture * 100:.1f}% of the capture's)"
    )
    print("raw: " + str(seconds))


main()
