#!/usr/bin/env python3
"""What capture costs a training job, measured inside one process: the job (overhead_job.py)
runs steps back to back while capture is switched on and off in alternate windows; each window
with capture is compared with the windows without it on either side. Between separate processes
the plain step time alone moves by ±15% on a GPU machine; inside one process, 1% resolves.

    sudo python3 bench/overhead.py --gpuprof target/release/gpuprof --workload encoder \\
        --capture ebpf,shim,attach,floor,ebpf-driver,daemon [--windows 4 --window 4] [--switches 12 --switch-window 2]

Captures, each switched on and off by the means a user has. Switched through a daemon's level
API (POST /v1/level), quickly, many short windows; each family in a job of its own:
  ebpf         a daemon at the driver's level raises the job to tensors and lowers it again:
               allocator probes of the job's own, every tensor event with its Python stack and
               autograd attribution
  shim         the job runs with the shim preloaded, sending to a shim-only daemon that raises
               it from off to tensors and back: paused, the hook only forwards to libc10
  shim-driver  the same between off and driver
  shim-timed   `shim` in a job of its own whose shim times each report's phases (GPUPROF_SHIM_TIMING:
               the breakdown; its clock reads cost a report some 200 ns, so its ratio is not the
               shim's)
Started and stopped as processes, fewer and longer windows, in one plain job:
  none         nothing either way: the method's own spread (an A/A check)
  attach       `gpuprof attach PID` started, then stopped (Ctrl-C): the whole eBPF capture at
               tensors, into a recording
  attach-entry    the same with its probes on each function's first instruction (`--probe-at
               entry`, as before gpuprof placed them where the kernel needs no second trap)
  attach-nostacks the same without Python stacks (`--no-stacks`)
  attach-phases   the same with the allocator probe timing its phases (`--profile-probes`: where a
               report's time goes in the kernel, each phase's clock read included)
  ebpf-driver  `gpuprof attach --level driver`: the driver's calls only, no tensor events
  floor-entry  empty BPF programs on the first instruction of the allocator symbol: the trap alone
  floor        empty BPF programs where gpuprof puts its allocator probe: the trap alone
  daemon       `gpuprof daemon` with its defaults (driver level, raising what grows) started,
               then stopped (SIGTERM)

Per capture: the median step time without and with it, their ratio (the median over windows of
each window's median step against its neighbours', with a 90% interval by resampling windows), the time added per allocator report (a step's reports: allocations and frees), the
training thread's CPU per report (`reports`/`standin` workloads: the thread that makes them), the
CPU per report of the agent (attach, the daemon) and of the shim's sender thread, for eBPF each
BPF program's run time per run (kernel.bpf_stats_enabled is switched on for the measurement), and
for the shim its counters (drops, waits) and its own timing of each report's phases
(GPUPROF_SHIM_TIMING). --json FILE keeps it all. --collector BIN runs a gpuprof-collector the
daemons send to, as on a fleet's node (else they write jsonl to /dev/null).
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Captures started and stopped as processes, in one plain job.
PROCESS_MODES = {
    "none",
    "attach",
    "attach-entry",
    "attach-nostacks",
    "attach-phases",
    "ebpf-driver",
    "floor-entry",
    "floor",
    "daemon",
}
# Captures switched through a daemon's level API ((off, on) levels), in a job of their family.
LEVELS = {
    "ebpf": ("driver", "tensors"),
    "shim": ("off", "tensors"),
    "shim-driver": ("off", "driver"),
    "shim-timed": ("off", "tensors"),
}
FAMILY = {"ebpf": "ebpf", "shim": "shim", "shim-driver": "shim", "shim-timed": "shim-timed"}
# Modes whose programs' run times are read.
BPF_MODES = PROCESS_MODES | {"ebpf"}
# A window's first part is left out: a capture started as a process settles (the first code
# descriptions, warm caches) for half a second, a switched one for a tenth.
SETTLE_S = {True: 0.1, False: 0.5}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A gpuprof process whose stderr is kept (and watched for a line saying it is ready)."""

    def __init__(self, argv, ready_text, env=None, ready_url=None):
        self.argv = argv
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
        )
        self.lines = []
        self.ready = threading.Event()
        self.ready_text = ready_text
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 60
        while not self.ready.is_set():
            if self.proc.poll() is not None:
                raise SystemExit(f"{argv[:3]} ended before it was ready: {''.join(self.lines)[-2000:]}")
            if ready_url and _get(ready_url) == 200:
                self.ready.set()
            if time.monotonic() > deadline:
                raise SystemExit(f"{argv[:3]} not ready within 60 s: {''.join(self.lines)[-2000:]}")
            self.ready.wait(0.05)

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if self.ready_text and self.ready_text in line:
                self.ready.set()

    def stop(self, sig=signal.SIGINT):
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        time.sleep(0.05)
        return "".join(self.lines)


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status
    except Exception:
        return None


def post(url):
    request = urllib.request.Request(url, method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read() or b"null")


def cpu_ns(pid):
    """{thread name: CPU ns} of a process, from each thread's schedstat."""
    by_name = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            ns = int((task / "schedstat").read_text().split()[0])
        except OSError:
            continue
        by_name[name] = by_name.get(name, 0) + ns
    return by_name


def bpf_program_stats(pid):
    """(name, run_cnt, run_time_ns) of every BPF program the process holds, from the kernel's
    counters in /proc/PID/fdinfo (with kernel.bpf_stats_enabled=1)."""
    stats = []
    for fd in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            fields = dict(line.split(":", 1) for line in fd.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if "prog_type" in fields and "run_cnt" in fields:
            stats.append((program_name(pid, int(fd.name)), int(fields["run_cnt"]), int(fields["run_time_ns"])))
    return stats


def program_name(pid, fd):
    """A BPF program's name, asked of the kernel through a copy of the process's descriptor (no
    bpftool needed): pidfd_open, pidfd_getfd, then BPF_OBJ_GET_INFO_BY_FD."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(434, pid, 0)
    if pidfd < 0:
        return f"fd{fd}"
    copy = libc.syscall(438, pidfd, fd, 0)
    os.close(pidfd)
    if copy < 0:
        return f"fd{fd}"
    info = ctypes.create_string_buffer(80)
    # union bpf_attr's info: bpf_fd, info_len, info (a pointer).
    attr = (ctypes.c_uint32 * 4)()
    attr[0], attr[1] = copy, 80
    ctypes.memmove(ctypes.addressof(attr) + 8, ctypes.byref(ctypes.c_uint64(ctypes.addressof(info))), 8)
    failed = libc.syscall(321, 15, ctypes.byref(attr), 16)
    os.close(copy)
    return f"fd{fd}" if failed else info.raw[64:80].split(b"\0")[0].decode()


class Job:
    """overhead_job.py, started once for a family of captures; its stderr kept in a file (the
    shim's counters line, with its timing, is there at the end)."""

    def __init__(self, args, env, out):
        argv = [args.python, str(HERE / "overhead_job.py"), args.workload, "--depth", str(args.depth), "--out", out]
        self.stderr_path = out + ".stderr"
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            stderr=open(self.stderr_path, "w"),
            env={**os.environ, **env},
        )
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "ready":
            raise SystemExit(f"the job did not start: {line}")
        self.pid, self.reports_per_step, self.out = int(line[1]), float(line[2]), out

    def finish(self):
        self.proc.stdin.write("stop\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=120)
        return json.load(open(self.out))["steps"]

    def shim_counters(self):
        """The shim's counters line from the job's stderr (GPUPROF_SHIM_REPORT), if any."""
        for line in open(self.stderr_path):
            if line.startswith('{"gpuprof_shim"'):
                return json.loads(line)["gpuprof_shim"]
        return None


class Capture:
    """Switches one capture on and off for the job's process."""

    def __init__(self, mode, args, job, daemon):
        self.mode, self.args, self.job, self.daemon = mode, args, job, daemon
        self.process = None
        self.tmp = tempfile.mkdtemp(prefix="gpuprof-overhead-")
        self.text = []

    def on(self):
        gpuprof, pid = self.args.gpuprof, str(self.job.pid)
        output = ["-o", os.path.join(self.tmp, "window.gpuprof")]
        attach = {
            "attach": [],
            "attach-entry": ["--probe-at", "entry"],
            "attach-nostacks": ["--no-stacks"],
            "attach-phases": ["--profile-probes"],
            "ebpf-driver": ["--level", "driver"],
            "floor-entry": ["--empty-probes", "--probe-at", "entry"],
            "floor": ["--empty-probes"],
        }
        if self.mode in attach:
            self.process = Process([gpuprof, "attach", pid, *attach[self.mode], *output], "capturing pid")
        elif self.mode == "daemon":
            port = free_port()
            self.process = Process(
                [gpuprof, "daemon", "--listen", f"127.0.0.1:{port}", *sink(self.args)],
                None,
                ready_url=f"http://127.0.0.1:{port}/readyz",
            )
        elif self.mode in LEVELS:
            self.daemon.set(self.job.pid, LEVELS[self.mode][1])
        if self.process:
            return self.process.proc.pid
        return self.daemon.process.proc.pid if self.daemon else None

    def off(self):
        if self.mode in LEVELS:
            self.daemon.set(self.job.pid, LEVELS[self.mode][0])
        elif self.process:
            self.text.append(self.process.stop(signal.SIGTERM if self.mode == "daemon" else signal.SIGINT))
            self.process = None


class LevelDaemon:
    """A daemon for the whole measurement whose API switches the job's capture level: eBPF at
    the driver's level (the job raised to tensors and lowered again), or the shim's (the job's
    shim sends to it; off until raised)."""

    def __init__(self, args, family):
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        capture = ["--level", "driver"]
        if family.startswith("shim"):
            self.socket = os.path.join(tempfile.mkdtemp(prefix="gpuprof-shim-"), "shim.sock")
            capture = ["--capture", "shim", "--shim-socket", self.socket, "--level", "off"]
        self.process = Process(
            [args.gpuprof, "daemon", "--listen", f"127.0.0.1:{port}", "--no-auto-raise", *capture, *sink(args)],
            None,
            ready_url=f"{self.url}/readyz",
        )

    def set(self, pid, level):
        """Asks for `level`, waiting for the daemon to follow the job first (its scan)."""
        deadline = time.monotonic() + 15
        while True:
            try:
                return post(f"{self.url}/v1/level?pid={pid}&level={level}")
            except urllib.error.HTTPError as error:
                if error.code != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def sink(args):
    """Where a daemon sends what it captures: a gpuprof-collector over OTLP, as on a node of a
    fleet, when --collector runs one; else nowhere (a jsonl file to /dev/null)."""
    if args.collector_endpoint:
        return ["--otlp-endpoint", args.collector_endpoint]
    return ["--output", "/dev/null"]


def steps_in(steps, window):
    """(duration, thread CPU) of the steps wholly inside a window, past its settling."""
    start = window[1] + window[6] * 1e9
    return [(e - s, c) for s, e, c in steps if s >= start and e <= window[2]]


def measure(args, modes, family):
    """Alternate windows (off, mode₁ on, off, mode₂ on, …, off) in one job: `args.windows`
    rounds of `args.window` seconds for captures started as processes, `args.switches` rounds
    of `args.switch_window` for those switched through a daemon."""
    out = os.path.join(tempfile.mkdtemp(prefix="gpuprof-job-"), "steps.json")
    daemon = LevelDaemon(args, family) if family != "process" else None
    env = {}
    if family.startswith("shim"):
        shim = args.shim or str(Path(args.gpuprof).resolve().parent / "libgpuprof_shim.so")
        env = {
            "LD_PRELOAD": shim,
            "GPUPROF_SHIM_SOCKET": daemon.socket,
            "GPUPROF_SHIM_LEVEL": "off",
            "GPUPROF_SHIM_REPORT": "1",
        }
        if family == "shim-timed":
            env["GPUPROF_SHIM_TIMING"] = "1"
    try:
        return measure_in(args, modes, Job(args, env, out), daemon)
    finally:
        if daemon:
            tail = daemon.process.stop(signal.SIGTERM)
            if family.startswith("shim") and "dropped" in tail:
                print(tail.strip().splitlines()[-1], file=sys.stderr)


def measure_in(args, modes, job, daemon):
    # (mode or None, start_ns, end_ns, {job thread: cpu}, {capture thread: cpu}, BPF stats, settle s)
    windows = []

    def window(mode, capture=None):
        agent_pid = capture.on() if capture else None
        start = time.monotonic_ns()
        job_cpu = cpu_ns(job.pid)
        agent_cpu = cpu_ns(agent_pid) if agent_pid else {}
        bpf = bpf_program_stats(agent_pid) if agent_pid and mode in BPF_MODES else []
        time.sleep(args.switch_window if daemon else args.window)
        end = time.monotonic_ns()
        job_cpu = {k: v - job_cpu.get(k, 0) for k, v in cpu_ns(job.pid).items()}
        agent_cpu = {k: v - agent_cpu.get(k, 0) for k, v in cpu_ns(agent_pid).items()} if agent_pid else {}
        if bpf:
            before = {name: (n, t) for name, n, t in bpf}
            bpf = [
                (name, n - before.get(name, (0, 0))[0], t - before.get(name, (0, 0))[1])
                for name, n, t in bpf_program_stats(agent_pid)
            ]
        if capture:
            capture.off()
        windows.append((mode, start, end, job_cpu, agent_cpu, bpf, SETTLE_S[daemon is not None]))

    captures = {mode: Capture(mode, args, job, daemon) for mode in modes}
    window(None)
    for _ in range(args.switches if daemon else args.windows):
        for mode in modes:
            window(mode, captures[mode])
            window(None)
    steps = job.finish()
    texts = {mode: "".join(c.text) for mode, c in captures.items()}
    results = summarize(args, modes, windows, steps, job.reports_per_step, texts)
    counters = job.shim_counters()
    for mode in modes:
        results[mode]["shim_counters"] = counters
    return results


def summarize(args, modes, windows, steps, reports_per_step, texts):
    def median_ms(w):
        inside = steps_in(steps, w)
        return statistics.median(d for d, _ in inside) / 1e6 if inside else float("nan")

    def cpu_per_step_ns(w):
        inside = steps_in(steps, w)
        return statistics.median(c for _, c in inside) if inside else float("nan")

    results = {}
    for mode in modes:
        ratios, added, plain, captured, thread_added, capture_cpu, sender_cpu, programs = [], [], [], [], [], [], [], {}
        for i, w in enumerate(windows):
            if w[0] != mode:
                continue
            neighbours = [windows[j] for j in (i - 1, i + 1) if 0 <= j < len(windows) and windows[j][0] is None]
            off = statistics.mean(median_ms(n) for n in neighbours)
            on = median_ms(w)
            plain.append(off)
            captured.append(on)
            ratios.append(on / off)
            added.append((on - off) * 1e6 / reports_per_step)
            off_cpu = statistics.mean(cpu_per_step_ns(n) for n in neighbours)
            thread_added.append((cpu_per_step_ns(w) - off_cpu) / reports_per_step)
            reports = len(steps_in(steps, w)) * reports_per_step
            capture_cpu.append(sum(w[4].values()) / max(reports, 1))
            sender_cpu.append(w[3].get("gpuprof-shim", 0) / max(reports, 1))
            for name, runs, ns in w[5]:
                if runs:
                    entry = programs.setdefault(name, [0, 0])
                    entry[0] += runs
                    entry[1] += ns
        low, high = median_interval(ratios)
        results[mode] = {
            "plain_ms": statistics.median(plain),
            "captured_ms": statistics.median(captured),
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "ratio_90": [low, high],
            "pairs": [[off, on] for off, on in zip(plain, captured)],
            "added_ns_per_report": statistics.median(added),
            "training_thread_added_ns_per_report": statistics.median(thread_added),
            "agent_cpu_ns_per_report": statistics.median(capture_cpu),
            "sender_cpu_ns_per_report": statistics.median(sender_cpu),
            "bpf_programs": {str(k): {"runs": n, "ns_per_run": t / n} for k, (n, t) in programs.items()},
            "windows": len(ratios),
            "reports_per_step": reports_per_step,
            "stderr_tail": texts.get(mode, "")[-900:],
        }
    return results


def median_interval(values, draws=2000):
    """A 90% interval of the median, by resampling the windows (bootstrap; seeded: the same data
    gives the same interval)."""
    import random

    rng = random.Random(7)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.05 * draws)], medians[int(0.95 * draws) - 1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpuprof", required=True)
    parser.add_argument("--shim", help="libgpuprof_shim.so (default: next to --gpuprof)")
    parser.add_argument("--workload", default="encoder")
    parser.add_argument("--capture", default="ebpf")
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--window", type=float, default=4.0, help="seconds per window")
    parser.add_argument("--switches", type=int, default=40, help="windows of captures switched through a daemon")
    parser.add_argument("--switch-window", type=float, default=0.6, help="their seconds per window")
    parser.add_argument("--depth", type=int, default=20, help="framework frames above the step")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--collector", help="a gpuprof-collector binary: the daemons send to it over OTLP")
    args = parser.parse_args()
    args.collector_endpoint = None
    collector = None
    if args.collector:
        grpc, http = free_port(), free_port()
        store = tempfile.mkdtemp(prefix="gpuprof-collector-")
        collector = Process(
            [
                args.collector,
                "--grpc-listen",
                f"127.0.0.1:{grpc}",
                "--http-listen",
                f"127.0.0.1:{http}",
                "--db",
                os.path.join(store, "collector.redb"),
            ],
            None,
            ready_url=f"http://127.0.0.1:{http}/healthz",
        )
        args.collector_endpoint = f"http://127.0.0.1:{grpc}"
    modes = args.capture.split(",")
    unknown = set(modes) - PROCESS_MODES - set(LEVELS)
    if unknown:
        raise SystemExit(f"unknown capture(s) {sorted(unknown)}: see --help")
    Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
    results = {}
    for family in ("process", "ebpf", "shim", "shim-timed"):
        chosen = [m for m in modes if FAMILY.get(m, "process") == family]
        if chosen:
            results.update(measure(args, chosen, family))
    print(
        f"{args.workload}: {args.windows} windows of {args.window:.1f} s per capture started as a process, "
        f"{args.switches} of {args.switch_window:.1f} s per capture switched through a daemon, each family in a "
        f"process of its own; {next(iter(results.values()))['reports_per_step']:.0f} allocator reports a step"
    )
    print(
        f"{'capture':<13} {'plain ms':>9} {'with ms':>9} {'ratio':>7} {'90% interval':>13} {'ns/report':>10} "
        f"{'thread ns/r':>11} {'agent ns/r':>10} {'sender ns/r':>11}  bpf ns/run (runs)"
    )
    for mode, r in results.items():
        programs = " ".join(f"{name} {p['ns_per_run']:.0f} ({p['runs']})" for name, p in r["bpf_programs"].items())
        print(
            f"{mode:<13} {r['plain_ms']:>9.3f} {r['captured_ms']:>9.3f} {r['ratio']:>6.3f}x "
            f"{r['ratio_90'][0]:>6.3f}-{r['ratio_90'][1]:.3f} {r['added_ns_per_report']:>10.0f} "
            f"{r['training_thread_added_ns_per_report']:>11.0f} {r['agent_cpu_ns_per_report']:>10.0f} "
            f"{r['sender_cpu_ns_per_report']:>11.0f}  {programs}"
        )
    for mode, r in results.items():
        phases = [line for line in r["stderr_tail"].splitlines() if "by phase" in line]
        if phases:
            print(f"{mode}: {phases[-1].removeprefix('gpuprof: ')}")
    for mode, r in results.items():
        shim = r.get("shim_counters")
        if not shim or mode == "shim-driver":
            continue
        line = (
            f"{mode}: sent {shim['sent']}, dropped {shim['dropped_queue_full']}, waited {shim.get('waits', 0)} "
            f"times ({shim.get('wait_ns', 0) / 1e6:.1f} ms)"
        )
        timing = shim.get("timing")
        if timing:
            line += "; per recorded report on the calling thread (self-timed, the timing included): " + ", ".join(
                f"{k[:-3]} {v:.0f} ns" for k, v in timing.items() if k != "reports"
            )
        print(line)
    if collector:
        collector.stop(signal.SIGTERM)
    if args.json:
        Path(args.json).write_text(json.dumps({"workload": args.workload, "results": results}, indent=1))


if __name__ == "__main__":
    main()
