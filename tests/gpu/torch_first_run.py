"""The job of validate_first_run.sh: a model's weights, a forward pass whose activations are
freed, a kept tensor; prints PyTorch's own figures as JSON (the peak and the end) for comparison
with `gpuprof summary`. With --attach-me: prints them once allocated, waits for a line on stdin,
then allocates one more tensor and exits (for `gpuprof attach`)."""
import json
import sys

import torch

MiB = 1 << 20


def load_weights():
    return torch.empty(96 * MiB, dtype=torch.uint8, device="cuda")


def forward(x):
    return [torch.empty(64 * MiB, dtype=torch.uint8, device="cuda") for _ in range(2)]


def figures():
    stats = torch.cuda.memory_stats()
    return {
        "allocated": stats["allocated_bytes.all.current"],
        "reserved": stats["reserved_bytes.all.current"],
        "peak_allocated": stats["allocated_bytes.all.peak"],
    }


weights = load_weights()
if "--attach-me" in sys.argv:
    print(json.dumps(figures()), flush=True)
    sys.stdin.readline()
    extra = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    sys.exit(0)
activations = forward(weights)
del activations
kept = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(json.dumps(figures()), flush=True)
