"""What `pytest --gpuprof` checks, as functions over one test's events (the jsonl contract of
docs/events.md, as the shim writes them): the peak of the GPU memory the test allocated, and
what it allocated and left live. No pytest here: the plugin (`pytest_plugin`) feeds the events in
and turns the verdicts into test failures.

The unit is PyTorch's caching-allocator block (`allocator` events): what a tensor holds, so the
allocator's cache (`reserved`) is never a leak. A process that has made no allocator event (no
PyTorch, or CUDA called directly) is judged on its driver allocations instead, and the message
says so. These are per-test checks, not the leak rules of `gpuprof report` (model/src/findings/),
which judge a whole run's process tree.
"""

import json
import os
import re

# Sizes a marker may be given in: binary and decimal units, as memray's markers take them.
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(" + "|".join(UNITS) + r")\s*$")
# How many frames a failure shows when the test's own frame is not in the stack (another thread).
MAX_FRAMES = 12


def parse_size(value):
    """Bytes of a marker's limit: an int (bytes) or a string such as "1 GiB" or "512MB"; raises
    ValueError saying what is accepted."""
    units = ", ".join(UNITS)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"a limit cannot be negative ({value})")
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match:
            return int(float(match.group(1)) * UNITS[match.group(2)])
    raise ValueError(
        f'{value!r} is not a size: write a number and a unit, such as "1 GiB" (units {units}), or an int of bytes'
    )


def format_size(size):
    """`4.0 MiB`; the exact byte count follows where one decimal hides it (`1.0 GiB (1073741825 B)`)."""
    if size < 1024:
        return f"{size} B"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40)):
        if size < scale * 1024 or unit == "TiB":
            shown = f"{size / scale:.1f} {unit}"
            return shown if round(size / scale, 1) * scale == size else f"{shown} ({size} B)"


def read_own_events(path, start, pid):
    """The memory events (allocator and driver) of process `pid` in the jsonl file from byte
    `start` on, and the offset after the last whole line read. Other processes append to the same
    file (children inherit the shim), so their lines are skipped, a half-written one included."""
    with open(path, "rb") as file:
        file.seek(start)
        data = file.read()
    end = data.rfind(b"\n") + 1
    needle = b'"pid":%d,' % pid
    events = []
    for line in data[:end].splitlines():
        if needle not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a fragment of another process's line
        if event.get("pid") == pid and event.get("layer") in ("allocator", "driver"):
            events.append(event)
    return events, start + end


def has_allocator_events(path, start, pid):
    """Whether process `pid` wrote an allocator event to the file from `start` on, and the offset
    after the last whole line: cheap enough for the stretches between checked tests."""
    with open(path, "rb") as file:
        file.seek(start)
        data = file.read()
    end = data.rfind(b"\n") + 1
    needle = b'"pid":%d,' % pid
    seen = any(needle in line and b'"layer":"allocator"' in line for line in data[:end].splitlines())
    return seen, start + end


class Allocation:
    """One block (or driver allocation) the test made: where and what it was allocated with."""

    __slots__ = ("addr", "size", "stack")

    def __init__(self, addr, size, stack):
        self.addr, self.size, self.stack = addr, size, stack


def _operations(events, layer):
    """(op, key, allocation) for each allocation and free of `layer`, in order. Driver memory:
    successful device, managed, pool and VMM allocations (pinned host memory is not the GPU's);
    a VMM handle and a pointer never share a key."""
    for event in events:
        if event.get("layer") != layer or event.get("op") not in ("alloc", "free"):
            continue
        if layer == "driver" and (event.get("result", 0) != 0 or event.get("kind") == "host_pinned"):
            continue
        addr = event.get("addr", "0x0")
        key = (event.get("kind") == "vmm", int(addr, 16))
        yield event["op"], key, Allocation(addr, event.get("size", 0), event.get("stack", []))


def live_at_end(events, layer):
    """What the test allocated and had not freed when it ended, in allocation order."""
    live = {}
    for op, key, allocation in _operations(events, layer):
        if op == "alloc":
            live[key] = allocation
        else:
            live.pop(key, None)  # a free of something allocated before the test is not the test's
    return list(live.values())


def live_at_peak(events, layer):
    """What the test had allocated and not freed at the moment that sum was highest."""
    live, total, peak, peak_at = {}, 0, 0, -1
    operations = list(_operations(events, layer))
    for index, (op, key, allocation) in enumerate(operations):
        if op == "alloc":
            # The allocator reuses an address only after freeing it; a driver event lost in between
            # must not count the old block twice.
            total -= live[key].size if key in live else 0
            live[key] = allocation
            total += allocation.size
            if total > peak:
                peak, peak_at = total, index
        elif key in live:
            total -= live.pop(key).size
    live = {}
    for op, key, allocation in operations[: peak_at + 1]:
        if op == "alloc":
            live[key] = allocation
        else:
            live.pop(key, None)
    return list(live.values())


class Verdict:
    """A failed check: the message (what, then the offender's stack), a one-line summary of it,
    and where to point (the test's line in the offender's stack, else None)."""

    def __init__(self, text, summary, location):
        self.text, self.summary, self.location = text, summary, location


def _nouns(layer, count):
    if layer == "allocator":
        return "block" if count == 1 else "blocks", "allocated", ""
    noun = "driver allocation" if count == 1 else "driver allocations"
    return noun, "made", " (no allocator events in this process: driver memory counted)"


def leak_verdict(events, layer, frames_shown):
    """None when everything the test allocated was freed by its end."""
    live = live_at_end(events, layer)
    if not live:
        return None
    noun, verb, why = _nouns(layer, len(live))
    total = sum(a.size for a in live)
    largest = max(live, key=lambda a: a.size)
    head = (
        f"gpu_leak_free: {format_size(total)} in {len(live)} {noun} {verb} during the test are still live{why}; "
        f"the largest, {format_size(largest.size)} at {largest.addr}"
    )
    return _with_stack(head, largest, frames_shown)


def limit_verdict(events, layer, limit, frames_shown):
    """None when what the test allocated never summed to more than `limit` bytes at once."""
    live = live_at_peak(events, layer)
    total = sum(a.size for a in live)
    if total <= limit:
        return None
    noun, verb, why = _nouns(layer, len(live))
    largest = max(live, key=lambda a: a.size)
    head = (
        f"limit_gpu_memory: {format_size(total)} in {len(live)} {noun} {verb} during the test were live at its peak, "
        f"over the limit of {format_size(limit)}{why}; the largest, {format_size(largest.size)} at {largest.addr}"
    )
    return _with_stack(head, largest, frames_shown)


def _with_stack(head, allocation, frames_shown):
    """The message: `head`, then the offender's stack; the summary names the test's line in it."""
    lines, location = frames_shown(allocation.stack)
    text = "\n".join([head + ", allocated at:"] + ["    " + line for line in lines])
    summary = f"{head}, allocated at {location[0]}:{location[1]}" if location else head + ", allocated at:"
    return Verdict(text, summary, location)


def stack_lines(stack, test_file, test_names, first_line, root):
    """The allocation's frames as `file:line in function`, innermost first, down to the test's
    own frame (pytest's frames below it are noise); with the test's frame as (file, line).
    `test_names` are the names CPython may give the test's function (plain, qualified)."""
    lines, location = [], None
    for frame in stack:
        file, line, function = frame.get("file", "?"), frame.get("line", 0), frame.get("function", "?")
        shown = _relative(file, root)
        lines.append(f"{shown}:{line} in {function}")
        if (
            file == test_file
            and line >= first_line
            and (function in test_names or function.rsplit(".", 1)[-1] in test_names)
        ):
            location = (shown, line)
            break
    if not stack:
        lines.append("(no Python stack: allocated on a thread without Python frames)")
    elif location is None and len(lines) > MAX_FRAMES:
        lines = lines[:MAX_FRAMES] + [f"({len(stack) - MAX_FRAMES} more frames)"]
    return lines, location


def _relative(file, root):
    if root and file.startswith(root.rstrip(os.sep) + os.sep):
        return os.path.relpath(file, root)
    return file
