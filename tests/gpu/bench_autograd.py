"""Cost of backward attribution (reading autograd's thread-locals at each allocator event and
matching backward blocks to forward lines), same run, interleaved rounds: plain, `gpuprof run
--no-autograd` (allocator + driver capture with Python stacks) and `gpuprof run` (the same plus
attribution), through eBPF or (`--via shim`) the in-process shim. The figure is attribution's
added step time over the plain step time.

    python3 bench_autograd.py GPUPROF_BIN [--via ebpf|shim] [--model loop|gpt] [--rounds 5] [--steps 200]
"""
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench_rounds import interleaved, table

here = Path(__file__).resolve().parent
gpuprof = sys.argv[1]
model = sys.argv[sys.argv.index("--model") + 1] if "--model" in sys.argv else "loop"
rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
steps = sys.argv[sys.argv.index("--steps") + 1] if "--steps" in sys.argv else "200"
via = sys.argv[sys.argv.index("--via") + 1] if "--via" in sys.argv else "ebpf"


def loop(prefix=()):
    out = subprocess.run([*prefix, sys.executable, str(here / "torch_autograd.py"), "--model", model, "--steps", steps],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


run = [gpuprof, "run", "--via", via, "--output", "/dev/null"]
modes = {
    "plain": lambda: loop(),
    "gpuprof --no-autograd": lambda: loop([*run, "--no-autograd", "--"]),
    "gpuprof (with attribution)": lambda: loop([*run, "--"]),
}
results, per_step = interleaved(modes, rounds)
print(f"capture: {via}")
described = {"loop": "encoder loop (6 layers, d_model 128)", "gpt": "GPT-style (12 layers, d_model 1024, bf16)"}
median, _ = table(results, per_step, steps, rounds, model=described[model])
paired = [(w - n) / p for p, n, w in zip(results["plain"], results["gpuprof --no-autograd"], results["gpuprof (with attribution)"])]
added = median["gpuprof (with attribution)"] - median["gpuprof --no-autograd"]
print(f"attribution added / plain step: {added / median['plain'] * 100:.2f}% of medians, "
      f"{statistics.median(paired) * 100:.2f}% paired by round (rounds: {', '.join(f'{r * 100:.2f}%' for r in paired)})")
print("raw: " + json.dumps(results))
