"""Cost of the shim's tensor-level capture on the launch-bound training loop (train_loop.py),
same run, interleaved rounds: plain, PyTorch's own recorder (_record_memory_history,
stacks='python'), and the shim preloaded (every allocator report with its Python stack, as
jsonl to /dev/null, as the eBPF benchmark writes its output: what is measured is the capture,
not the disk).

    python3 bench_shim.py SHIM_LIBRARY [--rounds 5] [--steps 300] [--compare OTHER_SHIM_LIBRARY]

--compare adds a second shim build to the same rounds (to tell a change from this machine's drift).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

from bench_rounds import interleaved, table

here = Path(__file__).resolve().parent
shim = sys.argv[1]
rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
steps = sys.argv[sys.argv.index("--steps") + 1] if "--steps" in sys.argv else "300"
other = sys.argv[sys.argv.index("--compare") + 1] if "--compare" in sys.argv else None


def loop(extra=(), env=None):
    out = subprocess.run([sys.executable, str(here / "train_loop.py"), "--steps", steps, *extra],
                         capture_output=True, text=True, check=True, env={**os.environ, **(env or {})})
    if out.stderr.strip():
        print(out.stderr.strip(), file=sys.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def shimmed(library=shim):
    return loop(env={"LD_PRELOAD": library, "GPUPROF_SHIM_OUTPUT": "/dev/null"})


modes = {
    "plain": lambda: loop(),
    "torch recorder (stacks=python)": lambda: loop(["--record"]),
    "gpuprof shim (tensors, stacks)": shimmed,
}
if other:
    modes[f"compared: {Path(other).name}"] = lambda: shimmed(other)
results, per_step = interleaved(modes, rounds)
# Step times drift between rounds on a shared machine: each round's modes are compared with that
# round's plain run too ("paired").
median, paired = table(results, per_step, steps, rounds, paired=True)
plain = median["plain"]
added = {name: median[name] - plain for name in modes}
shim_added = added["gpuprof shim (tensors, stacks)"]
recorder_added = added["torch recorder (stacks=python)"]
print(f"recorder added / shim added: {recorder_added / shim_added:.1f}x" if shim_added > 0 else "the shim added no measurable time")
shim_paired, recorder_paired = paired["gpuprof shim (tensors, stacks)"] - 1, paired["torch recorder (stacks=python)"] - 1
print(f"paired: shim adds {shim_paired * 100:.1f}%, the recorder {recorder_paired * 100:.1f}%"
      + (f" ({recorder_paired / shim_paired:.1f}x the shim's)" if shim_paired > 0 else ""))
print("raw: " + json.dumps(results))
