#!/usr/bin/env python3
"""The node daemon under process churn: short-lived CUDA processes (libcuda stand-in: a context,
three allocations, two frees, exit) run 10 at a time, with no daemon (the baseline) and with
`gpuprof daemon` following them, in the same run. Reports the wall time per process in each
mode (the ratio is what the daemon adds, uprobes included), the daemon's CPU time per process,
and its resident memory as processes go by (bounded: exited processes are forgotten).

    sudo python3 bench/daemon_churn.py [--processes 2000]

Needs cc and a release build (cargo build --release -p gpuprof).
"""

import argparse
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import standins

ROOT = Path(__file__).resolve().parent.parent
GPUPROF = ROOT / "target" / "release" / "gpuprof"
WAVE = 10


def build(workdir):
    standins.libcuda(workdir / "standin")
    standins.program("workloads/churn_worker.c", workdir / "churn_worker", "-ldl")


def churn(workdir, count, on_hundred=None):
    env = {"LD_LIBRARY_PATH": str(workdir / "standin")}
    started = time.perf_counter()
    for first in range(0, count, WAVE):
        workers = [
            subprocess.Popen([workdir / "churn_worker", "0", "4096"], stdout=subprocess.DEVNULL, env=env)
            for _ in range(min(WAVE, count - first))
        ]
        for w in workers:
            if w.wait() != 0:
                sys.exit("a churn worker failed")
        if on_hundred and (first + WAVE) % 500 == 0:
            on_hundred(first + WAVE)
    return (time.perf_counter() - started) / count


def metrics(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return {
        line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and not line.startswith("#")
    }


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2000)
    parser.add_argument(
        "--gpuprof", type=Path, default=GPUPROF, help="the gpuprof to run as the daemon (another build, to compare)"
    )
    args = parser.parse_args()
    if not args.gpuprof.exists():
        sys.exit(f"{args.gpuprof} is missing: cargo build --release -p gpuprof")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        build(workdir)
        churn(workdir, 50)  # warm the page cache
        plain = churn(workdir, args.processes)
        port = 19465
        log = workdir / "daemon.log"
        daemon = subprocess.Popen(
            [
                args.gpuprof,
                "daemon",
                "--output",
                "/dev/null",
                "--libcuda",
                workdir / "standin" / "libcuda.so.1",
                "--listen",
                f"127.0.0.1:{port}",
                "--retain-exited",
                "1",
            ],
            stderr=log.open("w"),
        )
        while "/metrics on" not in log.read_text():
            time.sleep(0.05)
        rss = []
        cpu_before = cpu_seconds(daemon.pid)
        followed = churn(
            workdir, args.processes, lambda n: rss.append((n, metrics(port)["gpuprof_daemon_resident_bytes"] / 2**20))
        )
        cpu = cpu_seconds(daemon.pid) - cpu_before
        time.sleep(2.5)
        m = metrics(port)
        daemon.terminate()
        daemon.wait(timeout=30)
    print(
        f"{args.processes} processes, {WAVE} at a time, on {Path('/proc/cpuinfo').read_text().count('processor')} CPUs"
    )
    print(
        f"wall time per process: plain {plain * 1e3:.2f} ms, under the daemon {followed * 1e3:.2f} ms ({followed / plain:.2f}x)"
    )
    print(
        f"daemon CPU per process: {cpu / args.processes * 1e3:.2f} ms; events {int(m['gpuprof_daemon_events_total'])}, "
        f"lost {int(m['gpuprof_daemon_events_lost_total'])}; processes discovered {int(m['gpuprof_daemon_processes_discovered_total'])}, "
        f"retained at the end {int(m['gpuprof_daemon_processes_retained'])}"
    )
    print("daemon resident memory (MiB) after N processes: " + ", ".join(f"{n}: {mib:.1f}" for n, mib in rss))


if __name__ == "__main__":
    main()
