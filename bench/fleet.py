#!/usr/bin/env python3
"""The fleet at training rates: 1 (the baseline), 10, 100 and 1000 simulated nodes of 8
training processes at 50,000 allocator events a second each (gpuprof-fleet-sim: the recording's
training process is every process's template; one node's agent path runs once on a simulated
clock and every node sends its OTLP stream in real time), each size against a fresh
gpuprof-collector, in one run. Reports per node items and bytes a second, summarized and in full;
items lost; the collector's CPU, memory and finding latency.

    python3 bench/fleet.py [--recording bench/fixtures/torch_train.gpuprof] [--sizes 1,10,100,1000] [--seconds 60]

Needs a release build: cargo build --release -p gpuprof -p gpuprof-collector.
"""
import argparse
import json
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "target" / "release"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_size(args, nodes, workdir):
    grpc, http = free_port(), free_port()
    collector = subprocess.Popen(
        [RELEASE / "gpuprof-collector", "--db", workdir / f"fleet-{nodes}.redb",
         "--grpc-listen", f"127.0.0.1:{grpc}", "--http-listen", f"127.0.0.1:{http}", "--rate-limit", "100000"],
        stderr=subprocess.PIPE, text=True)
    collector.stderr.readline()
    try:
        sim = subprocess.run(
            [RELEASE / "gpuprof-fleet-sim", "--input", args.recording, "--nodes", str(nodes),
             "--processes", str(args.processes), "--rate", str(args.rate), "--seconds", str(args.seconds),
             "--worker-every", str(args.worker_every), "--threads", str(args.threads),
             "--collector-grpc", f"http://127.0.0.1:{grpc}", "--collector-http", f"http://127.0.0.1:{http}",
             "--collector-pid", str(collector.pid), "--timeout", "300"],
            capture_output=True, text=True)
        if sim.returncode != 0:
            sys.exit(f"gpuprof-fleet-sim failed at {nodes} nodes: {sim.stderr.strip()[-3000:]}")
        return json.loads(sim.stdout)
    finally:
        collector.terminate()
        collector.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recording", default=str(ROOT / "bench" / "fixtures" / "torch_train.gpuprof"))
    parser.add_argument("--sizes", default="1,10,100,1000")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--rate", type=float, default=50_000)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--worker-every", type=float, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    for binary in ("gpuprof-collector", "gpuprof-fleet-sim"):
        if not (RELEASE / binary).exists():
            sys.exit(f"{RELEASE / binary} is missing: cargo build --release -p gpuprof -p gpuprof-collector")
    with tempfile.TemporaryDirectory() as tmp:
        reports = []
        for n in args.sizes.split(","):
            report = run_size(args, int(n), Path(tmp))
            print(json.dumps(report), flush=True)
            reports.append(report)
    node = reports[0]["node"]
    full = node["full_stream"]
    print(f"\nper node: {node['events_per_s']:,.0f} events/s; summarized {node['items_per_s']:.1f} items/s, "
          f"{node['bytes_per_s'] / 1024:.1f} KiB/s; full stream {full['items_per_s']:,.0f} items/s, "
          f"{full['bytes_per_s'] / 2**20:.1f} MiB/s ({full['items_per_s'] / node['items_per_s']:,.0f}x the items); "
          f"{node['events_per_item']:,.0f} events an item; the agent path {node['agent_cpu_s_per_s']:.2f} cores\n")
    print("| nodes | processes | items/s in | lost | collector cores | collector RSS (MiB) | finding latency p50 / p99 / max (ms) | findings |")
    print("|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in reports:
        lat = r["finding_latency_ms"]
        items = (r["received"]["log_records"] + r["received"]["spans"] + r["received"]["metric_points"]) / r["seconds"]
        cores = r["collector"]["cpu_cores_used"]
        rss = r["collector"]["resident_bytes"] / 2**20
        print(f"| {r['nodes']} | {r['nodes'] * r['processes_per_node']} | {items:,.0f} | {r['otlp_items_lost']} | {cores:.3f} | {rss:.0f} "
              f"| {lat['p50']:.0f} / {lat['p99']:.0f} / {lat['max']:.0f} | {r['findings_served']} |")


if __name__ == "__main__":
    main()
