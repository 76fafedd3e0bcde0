"""Checks a validate_fleet.sh run: prints each fact and OK/MISMATCH, exits 1 on any mismatch.

    compare_fleet.py WORKDIR
"""
import csv
import json
import sys

work = sys.argv[1]
ok = True


def check(what, good, detail=""):
    global ok
    ok &= bool(good)
    print(f"{'OK      ' if good else 'MISMATCH'} {what}{': ' + detail if detail else ''}")


def metrics(path):
    values = {}
    for line in open(path):
        if line.strip() and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


daemon = metrics(f"{work}/fleet-daemon.metrics.txt")
collector = metrics(f"{work}/fleet-collector.metrics.txt")
processes = json.load(open(f"{work}/fleet.processes.json"))
at_end = json.load(open(f"{work}/fleet.processes.end.json"))
nvml = {int(row[0]): int(row[1]) for row in csv.reader(open(f"{work}/fleet.nvml.csv")) if row}
stderr = open(f"{work}/fleet-daemon.stderr").read()
otlp_line = [s for s in stderr.splitlines() if "otlp to " in s][-1]
print(otlp_line)

for i in range(4):
    facts = json.load(open(f"{work}/fleet.stats.{i}.json"))
    pid = facts["pid"]
    view = [p for p in processes if p["pid"] == pid][-1]
    got = view["allocator"].get("0", {})
    check(f"pid {pid} ({facts['steps']} steps): collector allocated/reserved = memory_stats()",
          got == {"allocated": facts["allocated"], "reserved": facts["reserved"]},
          f"collector {got}, memory_stats allocated {facts['allocated']} reserved {facts['reserved']}")
    print(f"         nvidia-smi used {nvml.get(pid)} MiB; reserved {facts['reserved'] / 2**20:.1f} MiB; "
          f"the rest ({(nvml.get(pid, 0) * 2**20 - facts['reserved']) / 2**20:.0f} MiB) is the context and module memory no allocation reports")
    spans = [p for p in at_end if p["pid"] == pid][-1]["spans"]
    check(f"pid {pid}: spans in its trace {spans} <= 2000", spans <= 2000)

check("daemon lost no event", daemon.get("gpuprof_daemon_events_lost_total", 1) == 0)
check("OTLP lost no item", "dropped 0 (queue full 0, delivery failed 0, too large 0); rejected by the collector 0" in otlp_line)
refused = sum(v for k, v in collector.items() if k.startswith("gpuprof_collector_refused_requests_total"))
check("the collector refused no request", refused == 0, f"{refused}")
sent = [int(w) for w in otlp_line.split("; sent ")[1].split(" in ")[0].replace(",", "").split() if w.isdigit()]
received = [int(collector[f'gpuprof_collector_received_total{{signal="{s}"}}']) for s in ("log_records", "spans", "metric_points")]
check("the collector received what the daemon sent", sent == received, f"sent {sent}, received {received}")
events = daemon["gpuprof_daemon_events_total"]
check(f"events per OTLP item {events / sum(sent):.0f} >= 100", events >= 100 * sum(sent), f"{events:.0f} events, {sum(sent)} items")
peak_kib = int(open(f"{work}/fleet-daemon.peak.txt").read().split()[1])
check(f"daemon peak resident {peak_kib / 1024:.1f} MiB under the 256 MiB cap", peak_kib < 256 * 1024)
largest = int(otlp_line.split("the largest ")[1].split(")")[0])
check(f"largest request {largest} bytes under 4 MiB", largest < 4 << 20)
findings = json.load(open(f"{work}/fleet.findings.json"))
for f in findings:
    frames = " < ".join(f"{x['function']} ({x['file'].rsplit('/', 1)[-1]}:{x['line']})" for x in f["stack"][:3])
    print(f"         finding {f['kind']} pid {f['pid']} {f['bytes']} B: {frames}")
keeper = json.load(open(f"{work}/fleet.stats.0.json"))["pid"]
check("a growth finding for the process that keeps activations",
      any(f["kind"] == "growth" and f["pid"] == keeper for f in findings))
sys.exit(0 if ok else 1)
