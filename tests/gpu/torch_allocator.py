"""A training loop for the allocator-level validation: PyTorch's own counters and curves.

Prints JSON: memory_stats() allocation counts, and samples of memory_allocated()/memory_reserved()
with the wall-clock time they were taken (to line up with gpuprof's events).
"""
import json
import os
import time

import torch

torch.cuda.init()
model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]).cuda()
optimizer = torch.optim.Adam(model.parameters())
samples = []


def sample(label):
    torch.cuda.synchronize()
    samples.append({"label": label, "ts": time.time_ns(), "allocated": torch.cuda.memory_allocated(),
                    "reserved": torch.cuda.memory_reserved()})


sample("start")
kept = []
for step in range(5):
    x = torch.randn(256, 512, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    kept.append(loss.detach())
    sample(f"step {step}")
big = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
sample("after 64 MiB tensor")
del big
sample("after del")
torch.cuda.empty_cache()
sample("after empty_cache")
stats_ts = time.time_ns()
stats = torch.cuda.memory_stats()
print(json.dumps({"pid": os.getpid(), "allocations": stats["allocation.all.allocated"], "frees": stats["allocation.all.freed"],
                  "stats_ts": stats_ts, "samples": samples}))
