"""The launch-bound training loop of the benchmark: a 6-layer transformer, d_model 128.

    train_loop.py [--steps N] [--record]   (--record: torch.cuda.memory._record_memory_history)

Prints JSON: median step time in ms and allocator allocations per step.
"""
import json
import statistics
import sys
import time

import torch

steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 200
layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=6).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 64, 128, device="cuda")
if "--record" in sys.argv:
    torch.cuda.memory._record_memory_history(stacks="python")
times = []
before = torch.cuda.memory_stats()["allocation.all.allocated"]
for step in range(steps + 20):
    start = time.perf_counter()
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch.cuda.synchronize()
    if step >= 20:
        times.append((time.perf_counter() - start) * 1000)
allocations = torch.cuda.memory_stats()["allocation.all.allocated"] - before
print(json.dumps({"median_ms": statistics.median(times), "allocations_per_step": allocations / (steps + 20)}))
