"""An evaluation loop without torch.no_grad() that runs out of GPU memory beside a neighbour whose
allocator caches 20 GiB.

    why_eval_oom.py [NEIGHBOUR_GIB] [SECONDS_TO_OOM]

First it starts the neighbour (why_neighbour.py, another job on the GPU: it allocates and frees
NEIGHBOUR_GIB, default 20, which its allocator keeps cached) and waits until it holds its cache;
only then does this process touch CUDA. Then it evaluates a classifier batch after batch, keeping
every batch's logits for the metrics at the end: without torch.no_grad() each logits tensor keeps
its forward's graph and saved activations alive. The batch is sized from the free memory
(torch.cuda.mem_get_info) so that the device fills in about SECONDS_TO_OOM (default 18) seconds,
3-8 GiB a second, until torch.OutOfMemoryError; it catches that, prints its facts (PyTorch's
message, its memory_stats()), ends the neighbour and exits 0. Every activation it keeps has the
same size, so its own allocator has nothing cached when the driver refuses: the neighbour's cache
is what would have made room.

Expected of gpuprof (tests/gpu/validate_why.sh): a `growth` diagnosed autograd_graph_retained,
with seconds_to_full, at Block.forward's line (`# why:block`; the logits are kept at
`# why:collect`), then exactly one `oom` diagnosed neighbour_cache whose sentence names the
neighbour's pid and its ~20 GiB cache. Prints the neighbour's facts and its own, one JSON line each.
"""
import json
import os
import subprocess
import sys
import time

from why_common import DEVICE, GiB, SMOKE, Pace, allocated, facts, memory_stats, torch, where
import torch.nn as nn
import torch.nn.functional as F

PERIOD = 0.1  # seconds a batch
NO_OOM_AFTER = 45.0  # seconds: the job gives up waiting for the OOM then


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return F.gelu(self.fc(x))  # why:block


class Classifier(nn.Module):
    def __init__(self, d_in, width, depth, classes):
        super().__init__()
        self.embed = nn.Linear(d_in, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x)))  # why:forward


def start_neighbour(gib):
    """The neighbour, once its allocator caches `gib` GiB: its process and its facts."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "why_neighbour.py")
    neighbour = subprocess.Popen([sys.executable, path, str(gib)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
    line = neighbour.stdout.readline()
    if not line.startswith("{"):
        neighbour.kill()
        sys.exit(f"why_eval_oom.py: the neighbour (pid {neighbour.pid}) ended before caching its memory: {line!r}")
    return neighbour, json.loads(line)


def stop_neighbour(neighbour):
    """Closes the neighbour's standard input, its cue to end; its last facts."""
    neighbour.stdin.close()
    rest = neighbour.stdout.read()
    neighbour.wait(60)
    return [json.loads(line) for line in rest.splitlines() if line.startswith("{")]


def bytes_per_sample(model, d_in):
    """What one sample's forward keeps alive with autograd on: its saved activations and logits."""
    with torch.no_grad():
        model(torch.randn(8, d_in, device=DEVICE))  # cuBLAS's workspace, before measuring
    probe_input = torch.randn(256, d_in, device=DEVICE)
    before = allocated()
    probe = model(probe_input)
    kept = allocated() - before
    del probe, probe_input
    if DEVICE == "cuda":
        torch.cuda.empty_cache()  # nothing cached of the probe: the allocator starts empty-handed
    return max(kept, 1) / 256


def evaluate(model, batches, pace, progress):
    outputs = []
    for i in range(10**9):
        outputs.append(model(batches[i % len(batches)]))  # why:collect
        progress["batches"] = i + 1
        if time.monotonic() > progress["deadline"]:
            break
        pace.wait()
    return outputs


def main():
    gib = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    seconds_to_oom = float(sys.argv[2]) if len(sys.argv) > 2 else 18.0
    neighbour, neighbour_facts = start_neighbour(gib)
    print(json.dumps(neighbour_facts), flush=True)

    d_in, width, depth, classes = (1024, 2048, 6, 1000) if not SMOKE else (32, 64, 2, 10)
    model = Classifier(d_in, width, depth, classes).to(DEVICE).eval()
    per_sample = bytes_per_sample(model, d_in)
    free, total = torch.cuda.mem_get_info() if DEVICE == "cuda" else (GiB, 2 * GiB)
    rate = min(max(free / seconds_to_oom, 1 * GiB), 8 * GiB)  # bytes a second
    batch = max(64, int(rate * PERIOD / per_sample) // 64 * 64) if not SMOKE else 64
    batches = [torch.randn(batch, d_in, device=DEVICE) for _ in range(2)]
    lines = where(["block", "forward", "collect"])
    base = allocated()
    started = time.monotonic()
    progress = {"batches": 0, "deadline": started + (1.0 if SMOKE else NO_OOM_AFTER)}
    plan = {"free_at_start": free, "total": total, "planned_bytes_per_second": round(rate),
            "bytes_per_sample": round(per_sample), "batch": batch,
            "planned_bytes_per_batch": round(per_sample * batch), "period": PERIOD,
            "block_bytes": batch * width * 4, "lines": lines}
    oom = None
    try:
        outputs = evaluate(model, batches, Pace(PERIOD), progress)
        stats, kept = memory_stats(), allocated() - base
    except torch.OutOfMemoryError as error:
        # The failed evaluation's outputs live until this block ends (the traceback holds them).
        stats, kept, oom = memory_stats(), allocated() - base, str(error)
    except RuntimeError as error:  # an OOM raised as another error (cuBLAS's, say): said as it is
        stats, kept, oom = memory_stats(), allocated() - base, f"{type(error).__name__}: {error}"
    elapsed = time.monotonic() - started
    outputs = None  # noqa: F841 -- drops the evaluation's outputs before the facts are taken
    facts("evaluator", stats=stats, oom=(oom or "").split("\n")[0][:800] or None, oom_error=oom is not None,
          seconds_to_oom=round(elapsed, 2), batches=progress["batches"], kept_bytes=kept,
          kept_bytes_per_second=round(kept / elapsed), allocated_after=allocated(), neighbour_pid=neighbour.pid,
          expect=[{"kind": "growth", "diagnosis": "autograd_graph_retained", "line": lines["block"],
                   "seconds_to_full": True, "also": {"kept at": lines["collect"]}},
                  {"kind": "oom", "diagnosis": "neighbour_cache", "line": lines["block"], "count": 1,
                   "lines": [lines["block"], lines["forward"]],  # 12 of a batch's 14 blocks are Block's
                   "names_pid": neighbour.pid, "also": {"forward": lines["forward"], "kept at": lines["collect"]}}],
          **plan)
    if oom is None:
        print(f"why_eval_oom.py: no out-of-memory error in {elapsed:.1f} s", file=sys.stderr, flush=True)
    for line in stop_neighbour(neighbour):
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
