"""The benchmark's launch-bound training loop (a 6-layer transformer, d_model 128, ~470 allocator
allocations a step), run for a while: one of a node's training processes.

    train_fleet.py --seconds S --stats FILE [--keep-every N] [--hold S] [--ready FILE]

Every --keep-every steps it keeps one activation (a leak that grows). At the end it writes
FILE: its pid, steps, memory_stats() (allocated and reserved now, allocations and frees) taken
after a synchronize; then it holds its memory for --hold seconds (so that gauges taken while it
is idle can be compared) and exits.
"""
import argparse
import json
import os
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, required=True)
parser.add_argument("--stats", required=True)
parser.add_argument("--keep-every", type=int, default=0)
parser.add_argument("--hold", type=float, default=0.0)
args = parser.parse_args()

layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=6).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(8, 64, 128, device="cuda")
kept = []


def step(n):
    out = model(x)
    loss = out.sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if args.keep_every and n % args.keep_every == 0:
        kept.append(out.detach().clone())


deadline = time.monotonic() + args.seconds
steps = 0
while time.monotonic() < deadline:
    step(steps)
    steps += 1
torch.cuda.synchronize()
stats = torch.cuda.memory_stats()
facts = {
    "pid": os.getpid(),
    "steps": steps,
    "ts": time.time_ns(),
    "allocated": stats["allocated_bytes.all.current"],
    "reserved": stats["reserved_bytes.all.current"],
    "allocations": stats["allocation.all.allocated"],
    "frees": stats["allocation.all.freed"],
    "kept": len(kept),
}
with open(args.stats + ".tmp", "w") as f:
    json.dump(facts, f)
os.rename(args.stats + ".tmp", args.stats)
time.sleep(args.hold)
