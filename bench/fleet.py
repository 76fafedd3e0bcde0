#!/usr/bin/env python3
"""The fleet at training rates: 1 (the baseline), 10, 100 and 1000 simulated nodes of 8
training processes at 50,000 allocator events a second each (gpuprof-fleet-sim: the recording's
training process is every process's template; one node's agent path runs once on a simulated
clock and every node sends its OTLP stream in real time), each size against a fresh
gpuprof-collector, in one run. Reports per node items and bytes a second, summarized and in full;
items lost; the collector's CPU, memory and finding latency.

With --shards N the nodes send through gpuprof's OpenTelemetry Collector (scripts/build-otelcol.sh;
memory_limiter, batch, load_balancing by host.name) to N gpuprof-collector shards, as
docs/deploy.md deploys a fleet past one collector; the report adds each shard's memory, the
nodes each serves (every node whole on one shard) and the Collector's CPU and memory.

    python3 bench/fleet.py [--recording bench/fixtures/torch_train.gpuprof] [--sizes 1,10,100,1000] [--seconds 60]
    python3 bench/fleet.py --sizes 1000 --shards 4

With --restart shard:N (or otelcol) --restart-at S, that shard (or the OpenTelemetry Collector) is
stopped S seconds after a shard first receives — SIGKILL, or SIGTERM with --restart-signal TERM — and
started again on its database (its configuration) and addresses --down-for seconds later; each size
runs first with nothing stopped, the baseline its finding latency and the Collector's memory are
compared with. What was
given up on the way (by the nodes' clients, by the Collector: its log) is reported, and with a shard
killed must be nothing, every finding served; with the Collector restarted, what the shards lack of
what the nodes sent is counted (docs/reliability.md).

    python3 bench/fleet.py --sizes 1000 --shards 4 --restart shard:0 --restart-at 20 --down-for 5
    python3 bench/fleet.py --sizes 1000 --shards 4 --restart otelcol --restart-signal KILL --restart-at 20 --down-for 5

Needs a release build: cargo build --release -p gpuprof -p gpuprof-collector -p gpuprof-fleet-sim.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "target" / "release"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_collector(workdir, name, grpc, http):
    """A gpuprof-collector on its database `name` and its ports; started again the same way after a kill."""
    collector = subprocess.Popen(
        [
            RELEASE / "gpuprof-collector",
            "--db",
            workdir / f"{name}.redb",
            "--grpc-listen",
            f"127.0.0.1:{grpc}",
            "--http-listen",
            f"127.0.0.1:{http}",
            "--rate-limit",
            "100000",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    collector.stderr.readline()
    return collector


# As a deployment runs it (docs/deploy.md): memory_limiter first, batch, then each node's data
# routed whole to one shard by host.name; each shard's exporter keeps its own queue and retry, set
# as deploy/otel-collector/loadbalancing.yaml sets them (testkit's SHARD_EXPORTER is the same).
OTELCOL_CONFIG = """extensions:
  health_check: {{endpoint: 127.0.0.1:{health}}}
receivers:
  otlp:
    protocols:
      grpc: {{endpoint: 127.0.0.1:{grpc}}}
processors:
  memory_limiter: {{check_interval: 1s, limit_mib: {limit}, spike_limit_mib: {spike}}}
  batch: {{timeout: 200ms}}
exporters:
  load_balancing:
    routing_key: attributes
    routing_attributes: [host.name]
    protocol:
      otlp: {{timeout: 10s, tls: {{insecure: true}}, retry_on_failure: {{initial_interval: 500ms, max_interval: 5s, max_elapsed_time: 300s}}}}
    resolver:
      static: {{hostnames: [{shards}]}}
service:
  extensions: [health_check]
  telemetry: {{metrics: {{level: none}}}}
  pipelines:
    logs: {{receivers: [otlp], processors: [memory_limiter, batch], exporters: [load_balancing]}}
    traces: {{receivers: [otlp], processors: [memory_limiter, batch], exporters: [load_balancing]}}
    metrics: {{receivers: [otlp], processors: [memory_limiter, batch], exporters: [load_balancing]}}
"""


def start_otelcol(workdir, shard_grpc, limit_mib, gomemlimit_mib):
    """The Collector, healthy: (its process, its OTLP/gRPC port, its log, a function that starts it
    again the same way, its log kept)."""
    binary = subprocess.run(["bash", ROOT / "scripts" / "build-otelcol.sh"], capture_output=True, text=True)
    if binary.returncode != 0:
        sys.exit(f"cannot build the OpenTelemetry Collector: {binary.stderr.strip()[-2000:]}")
    grpc, health = free_port(), free_port()
    config = workdir / "otelcol.yaml"
    config.write_text(
        OTELCOL_CONFIG.format(
            health=health,
            grpc=grpc,
            limit=limit_mib,
            spike=limit_mib // 4,
            shards=", ".join(f"127.0.0.1:{p}" for p in shard_grpc),
        )
    )
    log_path = workdir / "otelcol.log"
    log_path.write_text("")

    def launch():
        otelcol = subprocess.Popen(
            [binary.stdout.strip(), "--config", config],
            stdout=subprocess.DEVNULL,
            stderr=open(log_path, "a"),
            env={**os.environ, **({"GOMEMLIMIT": f"{gomemlimit_mib}MiB"} if gomemlimit_mib else {})},
        )
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/", timeout=1) as r:
                    if r.status == 200:
                        return otelcol
            except OSError:
                pass
            if otelcol.poll() is not None or time.time() > deadline:
                sys.exit(f"the OpenTelemetry Collector did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)

    return launch(), grpc, log_path, launch


def log_records_received(http):
    """What a shard says it received (0 while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith('gpuprof_collector_received_total{signal="log_records"} '):
                    return int(line.split()[-1])
    except OSError:
        pass
    return 0


def kill_and_restart(args, watched_http, kill, stop_process, start_again):
    """Stops `stop_process()` with args.restart_signal `args.restart_at` s after the shard at
    `watched_http` first receives, `start_again()` `args.down_for` s later; notes when in `kill`."""
    while log_records_received(watched_http) == 0:
        if kill.get("stop"):
            return
        time.sleep(0.1)
    kill["first_received"] = time.time()
    time.sleep(args.restart_at)
    process = stop_process()
    process.send_signal(signal.SIGKILL if args.restart_signal == "KILL" else signal.SIGTERM)
    process.wait(timeout=60)
    kill["killed"] = time.time()
    time.sleep(args.down_for)
    start_again()
    kill["restarted"] = time.time()


def run_size(args, nodes, workdir, restart=None):
    """One run of `nodes` nodes, in a folder of its own under `workdir`; `restart` (shard:N or
    otelcol) is stopped and started again during it."""
    workdir = workdir / f"{nodes}-{(restart or 'plain').replace(':', '-')}"
    workdir.mkdir()
    shards = max(args.shards, 1)
    ports = [(free_port(), free_port()) for _ in range(shards)]
    collectors = [start_collector(workdir, f"fleet-{nodes}-{n}", grpc, http) for n, (grpc, http) in enumerate(ports)]
    otelcol = [None]
    otelcol_log = None
    send_to = ports[0][0]
    if args.shards:
        otelcol[0], send_to, otelcol_log, relaunch_otelcol = start_otelcol(
            workdir, [grpc for grpc, _ in ports], args.otelcol_limit_mib, args.otelcol_gomemlimit_mib
        )
    kill = {}
    killer = None
    if restart:
        if restart == "otelcol":
            watched = ports[0][1]

            def start_again():
                otelcol[0] = relaunch_otelcol()

            def stop_process():
                return otelcol[0]
        else:
            n = int(restart.split(":")[1])
            watched = ports[n][1]

            def start_again():
                collectors[n] = start_collector(workdir, f"fleet-{nodes}-{n}", *ports[n])

            def stop_process():
                return collectors[n]

        killer = threading.Thread(target=kill_and_restart, args=(args, watched, kill, stop_process, start_again))
        killer.start()
    try:
        command = [
            RELEASE / "gpuprof-fleet-sim",
            "--input",
            args.recording,
            "--nodes",
            str(nodes),
            "--processes",
            str(args.processes),
            "--rate",
            str(args.rate),
            "--seconds",
            str(args.seconds),
            "--worker-every",
            str(args.worker_every),
            "--threads",
            str(args.threads),
            "--collector-grpc",
            f"http://127.0.0.1:{send_to}",
            "--collector-http",
            ",".join(f"http://127.0.0.1:{http}" for _, http in ports),
            "--collector-pid",
            ",".join(str(c.pid) for c in collectors),
            "--timeout",
            # What a Collector killed held is lost, findings too: counted, not waited for long.
            "60" if restart == "otelcol" else "300",
        ]
        if otelcol[0]:
            command += ["--otelcol-pid", str(otelcol[0].pid), "--otelcol-log", str(otelcol_log)]
        if restart == "otelcol":
            command += ["--count-loss"]
        sim = subprocess.run(command, capture_output=True, text=True)
        if sim.returncode != 0:
            sys.exit(f"gpuprof-fleet-sim failed at {nodes} nodes: {sim.stderr.strip()[-3000:]}")
        report = json.loads(sim.stdout)
        if killer:
            killer.join()
            if "restarted" not in kill:
                sys.exit(f"{restart} was not stopped and started again within the run: {kill}")
            report["restart"] = {
                "what": restart,
                "signal": args.restart_signal,
                "stopped_after_first_received_s": kill["killed"] - kill["first_received"],
                "down_s": kill["restarted"] - kill["killed"],
            }
        return report
    finally:
        kill["stop"] = True
        if killer:
            killer.join()
        for process in ([otelcol[0]] if otelcol[0] else []) + collectors:
            process.terminate()
            process.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recording", default=str(ROOT / "bench" / "fixtures" / "torch_train.gpuprof"))
    parser.add_argument("--sizes", default="1,10,100,1000")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--rate", type=float, default=50_000)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--worker-every", type=float, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--shards",
        type=int,
        default=0,
        help="send through gpuprof's OpenTelemetry Collector to this many gpuprof-collectors (0: straight to one)",
    )
    parser.add_argument(
        "--otelcol-limit-mib",
        type=int,
        default=1536,
        help="the Collector's memory_limiter limit (it refuses past it; the nodes retry)",
    )
    parser.add_argument(
        "--otelcol-gomemlimit-mib",
        type=int,
        default=0,
        help="GOMEMLIMIT for the Collector, MiB (0: Go's default, none)",
    )
    parser.add_argument(
        "--restart",
        default=None,
        help="shard:N or otelcol: stop it --restart-at s after a shard first receives, start it again --down-for s later",
    )
    parser.add_argument("--restart-at", type=float, default=20)
    parser.add_argument("--restart-signal", choices=["KILL", "TERM"], default="KILL")
    parser.add_argument("--down-for", type=float, default=5, help="seconds it stays down")
    args = parser.parse_args()
    if args.restart and not (
        args.shards
        and (
            args.restart == "otelcol"
            or args.restart.startswith("shard:")
            and args.restart[6:].isdigit()
            and int(args.restart[6:]) < args.shards
        )
    ):
        sys.exit(f"--restart {args.restart}: needs --shards N and is otelcol or shard:K with K below N")
    for binary in ("gpuprof-collector", "gpuprof-fleet-sim"):
        if not (RELEASE / binary).exists():
            sys.exit(f"{RELEASE / binary} is missing: cargo build --release -p gpuprof-collector -p gpuprof-fleet-sim")
    with tempfile.TemporaryDirectory() as tmp:
        reports = []
        for n in args.sizes.split(","):
            if args.restart:
                # The same size with nothing stopped first, in the same run: the baseline.
                plain = run_size(args, int(n), Path(tmp))
                print(json.dumps(plain), flush=True)
            report = run_size(args, int(n), Path(tmp), args.restart)
            if args.restart:
                report["baseline"] = {k: plain[k] for k in ("finding_latency_ms", "otelcol", "shards")}
            print(json.dumps(report), flush=True)
            reports.append(report)
    node = reports[0]["node"]
    full = node["full_stream"]
    print(
        f"\nper node: {node['events_per_s']:,.0f} events/s; summarized {node['items_per_s']:.1f} items/s, "
        f"{node['bytes_per_s'] / 1024:.1f} KiB/s; full stream {full['items_per_s']:,.0f} items/s, "
        f"{full['bytes_per_s'] / 2**20:.1f} MiB/s ({full['items_per_s'] / node['items_per_s']:,.0f}x the items); "
        f"{node['events_per_item']:,.0f} events an item; the agent path {node['agent_cpu_s_per_s']:.2f} cores\n"
    )
    print(
        "| nodes | processes | items/s in | lost | collector cores | collector RSS (MiB) | finding latency p50 / p99 / max (ms) | findings |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in reports:
        lat = r["finding_latency_ms"]
        items = (r["received"]["log_records"] + r["received"]["spans"] + r["received"]["metric_points"]) / r["seconds"]
        cores = r["collector"]["cpu_cores_used"]
        rss = r["collector"]["resident_bytes"] / 2**20
        print(
            f"| {r['nodes']} | {r['nodes'] * r['processes_per_node']} | {items:,.0f} | {r['otlp_items_lost']} | {cores:.3f} | {rss:.0f} "
            f"| {lat['p50']:.0f} / {lat['p99']:.0f} / {lat['max']:.0f} | {r['findings_served']} |"
        )
    if args.shards:
        print("\n| nodes | shard | nodes served | shard cores | shard RSS (MiB) |")
        print("|---:|---:|---:|---:|---:|")
        for r in reports:
            for n, (shard, served) in enumerate(zip(r["shards"], r["nodes_per_shard"])):
                print(
                    f"| {r['nodes']} | {n} | {served} | {shard['cpu_cores_used']:.3f} | {shard['resident_bytes'] / 2**20:.0f} |"
                )
        print(
            "\n| nodes | Collector cores | Collector RSS (MiB) | nodes on several shards | given up by the Collector (items / unsized batches) |"
        )
        print("|---:|---:|---:|---:|---|")
        for r in reports:
            o = r["otelcol"]
            g = r["otelcol_given_up"]
            print(
                f"| {r['nodes']} | {o['cpu_cores_used']:.3f} | {o['resident_bytes'] / 2**20:.0f} | {r['nodes_on_several_shards']} | {g['items']} / {g['batches_unsized']} |"
            )
    if args.restart:
        print(
            "\n| nodes | stopped | signal | after the first item (s) | down (s) | given up by the nodes | given up by the Collector | items the shards lack | findings served / expected |"
        )
        print("|---:|---|---|---:|---:|---:|---:|---:|---|")
        for r in reports:
            k = r["restart"]
            missing = r["items_missing"]
            print(
                f"| {r['nodes']} | {k['what']} | {k['signal']} | {k['stopped_after_first_received_s']:.1f} | {k['down_s']:.1f} "
                f"| {r['otlp_items_lost']} | {r['otelcol_given_up']['items']} items, {r['otelcol_given_up']['batches_unsized']} batches "
                f"| {'not comparable (a shard restarted)' if missing is None else sum(missing.values())} | {r['findings_served']} / {r['findings_expected']} |"
            )
        print(
            "\n| nodes | stopped | finding latency p99 / max (ms) | nothing stopped (the baseline) | ratio p99 / max | Collector RSS (MiB) / baseline |"
        )
        print("|---:|---|---|---|---|---|")
        for r in reports:
            lat, base = r["finding_latency_ms"], r["baseline"]["finding_latency_ms"]
            rss, base_rss = r["otelcol"]["resident_bytes"] / 2**20, r["baseline"]["otelcol"]["resident_bytes"] / 2**20
            print(
                f"| {r['nodes']} | {r['restart']['what']} ({r['restart']['signal']}) | {lat['p99']:,.0f} / {lat['max']:,.0f} "
                f"| {base['p99']:,.0f} / {base['max']:,.0f} | {lat['p99'] / base['p99']:.1f}x / {lat['max'] / base['max']:.1f}x "
                f"| {rss:,.0f} / {base_rss:,.0f} ({rss / base_rss:.2f}x) |"
            )


if __name__ == "__main__":
    main()
