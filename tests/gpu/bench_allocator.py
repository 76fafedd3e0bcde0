"""Cost of allocator-level capture on the launch-bound training loop (train_loop.py), same run,
interleaved rounds: plain, PyTorch's own recorder (_record_memory_history, stacks='python'),
a bare uprobe on c10::reportMemoryUsageToProfiler (the kernel's tracefs uprobe event: no BPF,
no record), and gpuprof (allocator + driver capture with Python stacks, `gpuprof run`).

    python3 bench_allocator.py GPUPROF_BIN [--rounds 3] [--steps 300]
"""
import json
import os
import subprocess
import sys
from pathlib import Path

from bench_rounds import interleaved, table

here = Path(__file__).resolve().parent
gpuprof = sys.argv[1]
rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
steps = sys.argv[sys.argv.index("--steps") + 1] if "--steps" in sys.argv else "300"
py = sys.executable
tracing = Path("/sys/kernel/tracing")
if not (tracing / "uprobe_events").exists():
    subprocess.run(["mount", "-t", "tracefs", "nodev", str(tracing)], check=True)

import torch  # noqa: E402  (only to find libc10.so)

libc10 = Path(torch.__file__).parent / "lib" / "libc10.so"
symbol = "_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE"
nm = subprocess.run(["nm", "-D", str(libc10)], capture_output=True, text=True, check=True).stdout
vaddr = int(next(line.split()[0] for line in nm.splitlines() if line.endswith(" " + symbol)), 16)
segments = subprocess.run(["readelf", "-lW", str(libc10)], capture_output=True, text=True, check=True).stdout
offset = None
for line in segments.splitlines():
    fields = line.split()
    if fields and fields[0] == "LOAD":
        file_off, seg_vaddr, mem_size = int(fields[1], 16), int(fields[2], 16), int(fields[5], 16)
        if seg_vaddr <= vaddr < seg_vaddr + mem_size:
            offset = vaddr - seg_vaddr + file_off
assert offset is not None


def loop(extra=(), prefix=()):
    out = subprocess.run([*prefix, py, str(here / "train_loop.py"), "--steps", steps, *extra],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def bare():
    fd = os.open(tracing / "uprobe_events", os.O_WRONLY | os.O_APPEND)
    os.write(fd, f"p:gpuprof_bench/report {libc10}:{offset:#x}\n".encode())
    os.close(fd)
    (tracing / "events/gpuprof_bench/report/enable").write_text("1")
    try:
        return loop()
    finally:
        (tracing / "events/gpuprof_bench/report/enable").write_text("0")
        # Appending (no O_TRUNC, which would clear every uprobe event, nor O_CREAT).
        fd = os.open(tracing / "uprobe_events", os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"-:gpuprof_bench/report\n")
        os.close(fd)


modes = {
    "plain": lambda: loop(),
    "torch recorder (stacks=python)": lambda: loop(["--record"]),
    "bare uprobe (tracefs)": bare,
    "gpuprof (allocator + driver, stacks)": lambda: loop(prefix=[gpuprof, "run", "--output", "/dev/null", "--"]),
}
results, per_step = interleaved(modes, rounds)
median, _ = table(results, per_step, steps, rounds)
plain = median["plain"]
added = {name: median[name] - plain for name in modes}
bare_added = added["bare uprobe (tracefs)"]
gp = added["gpuprof (allocator + driver, stacks)"]
print(f"gpuprof added / bare uprobe added: {gp / bare_added:.2f}x" if bare_added > 0 else "bare uprobe added no measurable time")
print(f"gpuprof added / torch recorder added: {gp / added['torch recorder (stacks=python)']:.2f}x")
print("raw: " + json.dumps(results))
