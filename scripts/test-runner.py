#!/usr/bin/python3
"""Runs each test binary of `cargo test` (cargo's target runner: .cargo/config.toml) with a limit
per test: a test still running GPUPROF_TEST_LIMIT_S seconds after it began (default 600) fails
with its name, and its binary and everything it started are stopped, so that a hung test costs
CI minutes, not the whole run.

libtest says which test runs long on its own: "test NAME has been running for over 60 seconds".
The runner counts from there and from libtest's result lines ("test NAME ... ok"), so it needs
the default output; with --quiet, --format or --list, and for what is not a test binary (cargo run,
benchmarks), it gets out of the way (exec). The tests' own waits have deadlines of their own
(testkit's deadline module); this is the last resort behind them.

It runs on the system's Python 3.11 or later (the standard library alone, nothing installed into
it): a pyenv shim in front of python3 would cost each test binary a tenth of a second.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time

LIMIT_VARIABLE = "GPUPROF_TEST_LIMIT_S"
DEFAULT_LIMIT_S = 600.0
# libtest's own threshold for its warning (std's TEST_WARN_TIMEOUT_S).
WARNED_AFTER_S = 60.0
RUNNING_LONG = re.compile(r"^test (\S+) has been running for over \d+ seconds$")
ENDED = re.compile(r"^test (\S+) \.\.\. ")


def watched(binary, args):
    """A libtest binary of this build, run for its tests with libtest's default output."""
    in_deps = os.path.basename(os.path.dirname(binary)) == "deps"
    other_output = any(
        a in ("-q", "--quiet", "--list", "--bench", "--exact-list") or a.startswith("--format") for a in args
    )
    return in_deps and not other_output


def limit_of_environment():
    text = os.environ.get(LIMIT_VARIABLE, "")
    if not text:
        return DEFAULT_LIMIT_S
    try:
        limit = float(text)
    except ValueError:
        limit = -1.0
    if not limit > 0:
        sys.exit(f"gpuprof test runner: {LIMIT_VARIABLE}={text!r}: give a positive number of seconds")
    return limit


class Watch:
    """The tests libtest said run long, and when each began; the first past the limit."""

    def __init__(self, limit):
        self.limit = limit
        self.began = {}
        self.overdue = None
        self.lock = threading.Lock()

    def saw(self, line):
        long = RUNNING_LONG.match(line)
        ended = ENDED.match(line)
        with self.lock:
            if long:
                self.began.setdefault(long.group(1), time.monotonic() - WARNED_AFTER_S)
            elif ended:
                self.began.pop(ended.group(1), None)

    def past_limit(self):
        with self.lock:
            now = time.monotonic()
            for name, began in self.began.items():
                if now - began > self.limit:
                    self.overdue = name
                    return name, sorted(n for n in self.began if n != name)
        return None


def stop_group(child):
    """SIGTERM to the binary's process group, SIGKILL to what is left 5 s later."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait)
            if sig == signal.SIGKILL:
                return
        except subprocess.TimeoutExpired:
            continue
    # What it started may outlive it in the group: kill that too.
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main():
    if len(sys.argv) < 2:
        sys.exit("gpuprof test runner: cargo runs it with a test binary and its arguments (.cargo/config.toml)")
    binary, args = sys.argv[1], sys.argv[2:]
    if not watched(binary, args):
        os.execv(binary, [binary, *args])
    watch = Watch(limit_of_environment())
    if sys.stdout.isatty() and not any(a.startswith("--color") for a in args):
        # Through the pipe, libtest would take the terminal for a file and drop its colours.
        args = [*args, "--color=always"]
    # Its own process group, so that what a hung test started ends with it.
    child = subprocess.Popen([binary, *args], stdout=subprocess.PIPE, process_group=0)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, _frame: os.killpg(child.pid, s))

    def relay():
        for raw in child.stdout:
            sys.stdout.buffer.write(raw)
            sys.stdout.buffer.flush()
            watch.saw(raw.decode("utf-8", "replace").rstrip("\n"))

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    while child.poll() is None:
        overdue = watch.past_limit()
        if overdue:
            name, others = overdue
            stop_group(child)
            reader.join(timeout=5)
            cut = f"; cut short with it: {', '.join(others)}" if others else ""
            print(f"test {name} ... FAILED", flush=True)
            print(
                f"gpuprof test runner: test {name} ran past its limit of {watch.limit:g} s ({LIMIT_VARIABLE}): "
                f"stopped {os.path.basename(binary)} and what it started{cut}",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(101)
        try:
            # Back as soon as the binary ends; else looks at the limit again.
            child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
    reader.join()
    code = child.returncode
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
