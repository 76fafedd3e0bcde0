#!/usr/bin/env python3
"""Fleet simulation: the collector's ingest rate and finding latency with 1 (the baseline), 10,
100 and 1000 simulated nodes, each replaying process trees of a recorded capture through the
agent's own OTLP export (gpuprof-fleet-sim), all in one run against one gpuprof-collector per
size.

    python3 bench/fleet.py [--recording bench/fixtures/torch_train.jsonl.gz] [--processes 2] [--sizes 1,10,100,1000]

Needs a release build: cargo build --release -p gpuprof -p gpuprof-collector.
"""
import argparse
import gzip
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "target" / "release"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_size(nodes, processes, recording, workdir):
    grpc, http = free_port(), free_port()
    collector = subprocess.Popen(
        [RELEASE / "gpuprof-collector", "--db", workdir / f"fleet-{nodes}.redb",
         "--grpc-listen", f"127.0.0.1:{grpc}", "--http-listen", f"127.0.0.1:{http}", "--rate-limit", "100000"],
        stderr=subprocess.PIPE, text=True)
    collector.stderr.readline()
    try:
        started = time.process_time()
        sim = subprocess.run(
            [RELEASE / "gpuprof-fleet-sim", "--input", recording, "--nodes", str(nodes), "--processes", str(processes),
             "--threads", "2", "--collector-grpc", f"http://127.0.0.1:{grpc}", "--collector-http", f"http://127.0.0.1:{http}",
             "--timeout", "600"],
            capture_output=True, text=True)
        if sim.returncode != 0:
            sys.exit(f"gpuprof-fleet-sim failed at {nodes} nodes: {sim.stderr.strip()}")
        report = json.loads(sim.stdout)
        status = Path(f"/proc/{collector.pid}/status").read_text()
        report["collector_rss_mib"] = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
        return report
    finally:
        collector.terminate()
        collector.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recording", default=str(ROOT / "bench" / "fixtures" / "torch_train.jsonl.gz"))
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--sizes", default="1,10,100,1000")
    args = parser.parse_args()
    for binary in ("gpuprof-collector", "gpuprof-fleet-sim"):
        if not (RELEASE / binary).exists():
            sys.exit(f"{RELEASE / binary} is missing: cargo build --release -p gpuprof -p gpuprof-collector")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        recording = Path(args.recording)
        if recording.suffix == ".gz":
            plain = workdir / recording.stem
            plain.write_bytes(gzip.decompress(recording.read_bytes()))
            recording = plain
        events = sum(1 for _ in recording.open())
        print(f"recording: {args.recording} ({events} events per process tree), {args.processes} trees per node")
        reports = [run_size(int(n), args.processes, recording, workdir) for n in args.sizes.split(",")]
    base = reports[0]["ingest_events_per_s"]
    print("| nodes | events | ingest events/s | vs 1 node | finding latency p50 / p99 / max (ms) | collector RSS (MiB) |")
    print("|---:|---:|---:|---:|---|---:|")
    for r in reports:
        lat = r["finding_latency_ms"]
        print(f"| {r['nodes']} | {r['events_received']} | {r['ingest_events_per_s']:,.0f} | {r['ingest_events_per_s'] / base:.2f}x "
              f"| {lat['p50']:.0f} / {lat['p99']:.0f} / {lat['max']:.0f} | {r['collector_rss_mib']:.0f} |")
    print(json.dumps(reports))


if __name__ == "__main__":
    main()
