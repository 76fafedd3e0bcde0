"""`pytest --gpuprof`: GPU memory limits and leak checks per test, as memray's `limit_memory` and
`limit_leaks` are for host memory (docs/pytest.md).

    @pytest.mark.limit_gpu_memory("1 GiB")   # the test's allocations never sum to more at once
    @pytest.mark.gpu_leak_free               # nothing the test allocated is live at its end

A failing test shows the bytes, the count and the stack of the largest offender, down to the
test's own line. Without `--gpuprof` the markers do nothing.

How, without root: gpuprof's shim (libgpuprof_shim.so) must be in the process before CUDA or
PyTorch load, so with `--gpuprof` pytest restarts itself once, before any conftest is imported,
with the shim preloaded writing to a temporary jsonl file. Around each marked test the shim is
flushed (`gpuprof_shim_flush`, called through ctypes) and the events this process wrote in
between are judged (`checks`). Only the test's call phase counts: fixtures' setup and teardown
do not.
"""

import ctypes
import os
import sys
import tempfile

import pytest

from . import SHIM_FILE, checks, shim_path

# The events file the restarted pytest reads (set with the shim; inherited by children).
EVENTS_VAR = "GPUPROF_PYTEST_EVENTS"
# The pid that restarted itself with the shim: the one that owns (and removes) the events file,
# and that must find the shim loaded after the restart.
RESTARTED_VAR = "GPUPROF_PYTEST_RESTARTED"
MARKERS = (
    "limit_gpu_memory(limit): under pytest --gpuprof, fail when the GPU memory the test allocated "
    'peaks over limit ("1 GiB"; units B, KiB, MiB, GiB, KB, MB, GB; or an int of bytes)',
    "gpu_leak_free: under pytest --gpuprof, fail when GPU memory the test allocated is still live at its end",
)


def pytest_addoption(parser):
    parser.getgroup("gpuprof").addoption(
        "--gpuprof",
        action="store_true",
        default=False,
        help="check tests marked limit_gpu_memory or gpu_leak_free (pytest restarts itself once with gpuprof's shim preloaded)",
    )


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    # Outermost, so the restart comes before pytest captures the output descriptors and before any
    # conftest imports CUDA or PyTorch.
    if early_config.known_args_namespace.gpuprof:
        _restart_with_the_shim()
    yield


def pytest_configure(config):
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    if config.getoption("gpuprof"):
        config.pluginmanager.register(GpuMemoryChecks(config), "gpuprof-checks")


def _flush_function():
    """The preloaded shim's `gpuprof_shim_flush`, or None when no shim is in the process."""
    try:
        flush = ctypes.CDLL(None).gpuprof_shim_flush
    except AttributeError:
        return None
    flush.argtypes = []
    flush.restype = ctypes.c_int
    return flush


# What `gpuprof_shim_driver_calls` returns, when the shim does not see the driver's calls: why.
BLIND = {
    0: "CUDA was initialized without the shim's CUPTI subscription (another library named by CUDA_INJECTION64_PATH?)",
    2: "another CUPTI subscriber (a profiler: PyTorch's, Nsight) holds this process's only slot",
    3: "no libcupti was found: set GPUPROF_CUPTI=/path/to/libcupti.so (it comes with the CUDA toolkit and with PyTorch's nvidia-cuda-cupti wheel)",
    4: "CUPTI refused the shim's subscription (the shim's warning on stderr says how)",
    5: "the shim handed CUPTI over to a profiler that subscribed after it",
}
SUBSCRIBED = 1


def _driver_calls_function():
    """The preloaded shim's `gpuprof_shim_driver_calls`, or None for a shim without it."""
    try:
        state = ctypes.CDLL(None).gpuprof_shim_driver_calls
    except AttributeError:
        return None
    state.argtypes = []
    state.restype = ctypes.c_int
    return state


def _libcuda_loaded():
    """Whether this process mapped libcuda: it may have called the driver."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return b"/libcuda.so" in maps.read()
    except OSError:
        return False


def _restart_with_the_shim():
    events = os.environ.get(EVENTS_VAR)
    if events and os.environ.get("GPUPROF_SHIM_OUTPUT") == events and _flush_function() is not None:
        return  # restarted already (or a worker process that inherited the shim)
    if os.environ.get(RESTARTED_VAR) == str(os.getpid()):
        raise pytest.UsageError(
            f"--gpuprof: pytest restarted itself with LD_PRELOAD={os.environ.get('LD_PRELOAD', '')} but the shim is not in the "
            "process (the dynamic loader ignored it: a setuid interpreter, or a shim built for another platform)"
        )
    try:
        shim = shim_path()
    except FileNotFoundError as error:
        raise pytest.UsageError(f"--gpuprof: {error}") from None
    descriptor, events = tempfile.mkstemp(prefix="gpuprof-pytest-", suffix=".jsonl")
    os.close(descriptor)
    env = dict(os.environ)
    # One shim per process: one preloaded already (`gpuprof run --via shim`) gives way to this one.
    preloaded = [
        p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p and os.path.basename(p) != SHIM_FILE
    ]
    env["LD_PRELOAD"] = ":".join([shim] + preloaded)
    env["GPUPROF_SHIM_OUTPUT"] = events
    # A process's shim has one destination: under `gpuprof run --via shim` the tests' events come
    # here, not to that run's agent.
    env.pop("GPUPROF_SHIM_SOCKET", None)
    env[EVENTS_VAR] = events
    env[RESTARTED_VAR] = str(os.getpid())
    # The same command line, interpreter options included, however pytest was started
    # (`pytest`, `python -m pytest`, a script calling pytest.main).
    with open("/proc/self/cmdline", "rb") as file:
        argv = [os.fsdecode(arg) for arg in file.read().split(b"\0")[:-1]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable] + argv[1:], env)


class Wanted:
    """The checks a test's markers ask for."""

    def __init__(self, limit, leak_free):
        self.limit, self.leak_free = limit, leak_free


def _wanted(item):
    """The checks of a test, or None; a marker with bad arguments is a usage error naming it."""
    limit_marker = item.get_closest_marker("limit_gpu_memory")
    leak_marker = item.get_closest_marker("gpu_leak_free")
    limit = None
    if limit_marker is not None:
        shown = ", ".join([repr(a) for a in limit_marker.args] + [f"{k}={v!r}" for k, v in limit_marker.kwargs.items()])
        usage = f"{item.nodeid}: @pytest.mark.limit_gpu_memory({shown}): "
        if len(limit_marker.args) != 1 or limit_marker.kwargs:
            raise pytest.UsageError(usage + 'takes one limit, such as "1 GiB"')
        try:
            limit = checks.parse_size(limit_marker.args[0])
        except ValueError as error:
            raise pytest.UsageError(usage + str(error)) from None
    if leak_marker is not None and (leak_marker.args or leak_marker.kwargs):
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.gpu_leak_free takes no arguments")
    if limit is None and leak_marker is None:
        return None
    return Wanted(limit, leak_marker is not None)


class GpuMemoryFailure:
    """A test's failed GPU memory check, as pytest shows a failure (`longrepr`): the message in
    the failures section, its first line in the short summary, the test's line as the location."""

    class Crash:
        def __init__(self, path, lineno, message):
            self.path, self.lineno, self.message = path, lineno, message

        def __str__(self):
            return f"{self.path}:{self.lineno}: {self.message}"

    def __init__(self, text, summary, path, lineno):
        self.text = text
        self.reprcrash = self.Crash(path, lineno, summary)

    def toterminal(self, tw):
        for line in self.text.splitlines():
            tw.line(line)

    def __str__(self):
        return self.text


class GpuMemoryChecks:
    """The per-test checks, registered when --gpuprof is given (the process has the shim)."""

    def __init__(self, config):
        self.events = os.environ.get(EVENTS_VAR)
        self.flush = _flush_function()
        if not self.events or self.flush is None:
            raise pytest.UsageError(
                "--gpuprof: gpuprof's shim is not in this process (pytest did not restart itself with it)"
            )
        self.driver_calls = _driver_calls_function()
        self.root = str(getattr(config, "rootpath", None) or config.rootdir)
        # Bytes of the events file read so far (whole lines).
        self.read_to = 0
        # Allocator events seen from this process: from then on blocks are counted, not driver calls.
        self.allocator_seen = False
        self.wanted = {}
        self.failures = {}

    # Last, after `-k` and `-m` have deselected: a marker is read only on the tests that run.
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        for item in items:
            wanted = _wanted(item)
            if wanted is not None:
                self.wanted[item.nodeid] = wanted

    def _flush(self):
        return self.flush() == 0

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        wanted = self.wanted.get(item.nodeid)
        if wanted is None:
            yield
            return
        pid = os.getpid()
        flushed = self._flush()
        if self.allocator_seen:
            self.read_to = os.path.getsize(self.events)
        else:
            self.allocator_seen, self.read_to = checks.has_allocator_events(self.events, self.read_to, pid)
        start = self.read_to
        outcome = yield
        flushed = self._flush() and flushed
        events, self.read_to = checks.read_own_events(self.events, start, pid)
        if outcome.excinfo is not None:
            return  # the test's own failure is the one to show
        if not flushed:
            text = (
                "gpuprof: the shim did not write this process's events within 2 s: the GPU memory checks could not run"
            )
            self.failures[item.nodeid] = GpuMemoryFailure(text, text, item.location[0], item.location[1] + 1)
            return
        self.allocator_seen = self.allocator_seen or any(e["layer"] == "allocator" for e in events)
        layer = "allocator" if self.allocator_seen else "driver"
        blind = self._blind_to_driver_calls() if layer == "driver" else None
        if blind is not None:
            text = (
                f"gpuprof: this test's GPU memory was not checked: no allocator events in this process, and the shim "
                f"does not see its driver calls: {blind}; a test is not passed blind"
            )
            self.failures[item.nodeid] = GpuMemoryFailure(text, text, item.location[0], item.location[1] + 1)
            return
        shown = self._frames_shown(item)
        verdicts = []
        if wanted.limit is not None:
            verdicts.append(checks.limit_verdict(events, layer, wanted.limit, shown))
        if wanted.leak_free:
            verdicts.append(checks.leak_verdict(events, layer, shown))
        verdicts = [v for v in verdicts if v is not None]
        if verdicts:
            path, line = verdicts[0].location or (item.location[0], item.location[1] + 1)
            self.failures[item.nodeid] = GpuMemoryFailure(
                "\n".join(v.text for v in verdicts), verdicts[0].summary, path, line
            )

    def _blind_to_driver_calls(self):
        """Why the shim cannot see this process's driver calls, or None when it can (or when the
        process never loaded libcuda: nothing to see)."""
        if self.driver_calls is None:
            return "the shim is too old to say whether it sees them"
        state = self.driver_calls()
        if state == SUBSCRIBED or not _libcuda_loaded():
            return None
        return BLIND.get(state, f"the shim's CUPTI state is {state}")

    def _frames_shown(self, item):
        code = getattr(getattr(item, "function", None), "__code__", None)
        if code is None:
            return lambda stack: checks.stack_lines(stack, None, (), 0, self.root)
        names = {code.co_name, getattr(code, "co_qualname", code.co_name)}
        return lambda stack: checks.stack_lines(stack, code.co_filename, names, code.co_firstlineno, self.root)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        if call.when != "call":
            return
        failure = self.failures.pop(item.nodeid, None)
        report = outcome.get_result()
        if failure is not None and report.passed and not hasattr(report, "wasxfail"):
            report.outcome = "failed"
            report.longrepr = failure

    def pytest_unconfigure(self, config):
        if os.environ.get(RESTARTED_VAR) == str(os.getpid()):
            try:
                os.unlink(self.events)
            except OSError:
                pass
