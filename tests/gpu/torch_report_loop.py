"""The allocator benchmark's training loop (train_loop.py's 6-layer transformer, d_model 128) for
the HTML report's validation: PyTorch's own counters sampled at chosen steps with the wall-clock
time (the clock gpuprof's events carry), so the report's curves can be read at those instants; the
allocator's cache emptied at the end, so that reserved falls.

    torch_report_loop.py [--steps N]

Prints JSON: pid, samples (label, ts, allocated, reserved), memory_stats() at the end.
"""
import json
import os
import sys
import time

import torch

steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 300
layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=6).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 64, 128, device="cuda")
samples = []


def sample(label):
    samples.append({"label": label, "ts": time.time_ns(), "allocated": torch.cuda.memory_allocated(),
                    "reserved": torch.cuda.memory_reserved()})


for step in range(steps):
    loss = model(x).sum()
    if step % 60 == 7:
        sample(f"step {step}, after forward")
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if step % 60 == 7:
        sample(f"step {step}, after the optimizer")
torch.cuda.synchronize()
stats = torch.cuda.memory_stats()
del loss, x, model, optimizer, layer
sample("everything deleted")
torch.cuda.empty_cache()
sample("after empty_cache")
print(json.dumps({"pid": os.getpid(), "samples": samples, "peak_allocated": stats["allocated_bytes.all.peak"],
                  "allocations": stats["allocation.all.allocated"]}))
