"""A training job that keeps a little memory every step, for a node daemon at its default level:
the encoder loop of the benchmarks, and one line that appends a 1 MiB slice of the output to a
list every step (as a metrics buffer kept on the GPU would).

    torch_leak_job.py SECONDS

Prints one JSON line at the end: its pid, the leaking line (file, line), steps, the bytes kept,
and PyTorch's allocation counters.
"""
import json
import os
import sys
import time

import torch

seconds = float(sys.argv[1])
layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=6).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 64, 128, device="cuda")
history = []


def keep(out):
    history.append(out.detach().flatten()[: 1 << 18].clone())  # 1 MiB of float32, every step


def train(deadline):
    steps = 0
    while time.monotonic() < deadline:
        out = model(x)
        out.sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        keep(out)
        torch.cuda.synchronize()
        steps += 1
        time.sleep(0.01)
    return steps


steps = train(time.monotonic() + seconds)
stats = torch.cuda.memory_stats()
print(json.dumps({"pid": os.getpid(), "leak_file": os.path.abspath(__file__),
                  "leak_line": keep.__code__.co_firstlineno + 1, "steps": steps,
                  "kept_bytes": sum(t.numel() * t.element_size() for t in history),
                  "allocations": stats["allocation.all.allocated"], "reserved": torch.cuda.memory_reserved()}),
      flush=True)
