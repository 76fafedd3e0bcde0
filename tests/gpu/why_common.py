"""What the why_*.py jobs share (tests/gpu/validate_why.sh): torch, checked for a GPU; the job's
own line numbers, found by their marker comments (`# why:NAME`); a pace for the steps (the data
loader's time); and the one JSON line of facts each process prints at its end, with PyTorch's own
figures beside what gpuprof will say.

WHY_SMOKE=1 runs a job on the CPU for about a second at small sizes: a check of its code where
there is no GPU, without memory figures.
"""
import json
import os
import sys
import time

SMOKE = os.environ.get("WHY_SMOKE") == "1"
MiB = 1 << 20
GiB = 1 << 30

try:
    import torch
except ImportError as error:
    sys.exit(f"{os.path.basename(sys.argv[0])}: needs PyTorch ({error}); run it with the GPU machine's python")

DEVICE = "cpu" if SMOKE else "cuda"
if not SMOKE and not torch.cuda.is_available():
    sys.exit(f"{os.path.basename(sys.argv[0])}: needs a CUDA GPU, and torch.cuda.is_available() is False here "
             "(WHY_SMOKE=1 runs it on the CPU at small sizes, to check its code)")


def seconds(default):
    """How long the job's steps run: its first argument, else `default`; a second when smoking."""
    if SMOKE:
        return 1.0
    return float(sys.argv[1]) if len(sys.argv) > 1 else default


def marker(name, path=None):
    """The line of `path` (default: the calling job) whose comment is `# why:NAME`."""
    path = os.path.abspath(path or sys._getframe(1).f_code.co_filename)
    with open(path) as source:
        for number, text in enumerate(source, 1):
            if text.rstrip().endswith(f"# why:{name}") or f"# why:{name} " in text:
                return number
    raise LookupError(f"no '# why:{name}' in {path}")


def where(names, path=None):
    """{name: line} for the markers `names` of `path` (default: the calling job)."""
    path = os.path.abspath(path or sys._getframe(1).f_code.co_filename)
    return {name: marker(name, path) for name in names}


def allocated():
    return torch.cuda.memory_allocated() if DEVICE == "cuda" else 0


class Pace:
    """One step every `period` seconds, whatever the step took (a loader that delivers batches at
    that rate)."""

    def __init__(self, period):
        self.period = period
        self.next = time.monotonic() + period

    def wait(self):
        now = time.monotonic()
        if self.next > now:
            time.sleep(self.next - now)
        self.next = max(self.next + self.period, now)


def memory_stats():
    """torch.cuda.memory_stats() of the current device; nothing off the GPU."""
    return torch.cuda.memory_stats() if DEVICE == "cuda" and torch.cuda.is_initialized() else {}


def facts(role, stats=None, **fields):
    """Prints the process's facts as one JSON line: its pid, PyTorch's allocator figures
    (`stats`, else torch.cuda.memory_stats() of the current device now), and `fields`."""
    stats = memory_stats() if stats is None else stats
    line = {
        "pid": os.getpid(),
        "role": role,
        "file": os.path.abspath(sys.argv[0]),
        "allocated": stats.get("allocated_bytes.all.current"),
        "reserved": stats.get("reserved_bytes.all.current"),
        "peak_allocated": stats.get("allocated_bytes.all.peak"),
        "peak_reserved": stats.get("reserved_bytes.all.peak"),
        "ooms": stats.get("num_ooms"),
        "alloc_retries": stats.get("num_alloc_retries"),
        **fields,
    }
    # One write: the ranks of a job share one stdout, and their lines must not interleave.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (json.dumps(line) + "\n").encode())
    return line
