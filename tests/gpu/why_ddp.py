"""One rank of a two-process DDP job over NCCL, for SECONDS (default 7) of steps:

    python -m torch.distributed.run --standalone --nproc_per_node 2 why_ddp.py [SECONDS]

Every rank trains the same model (gradients all-reduced by DDP, 20 steps a second); rank 1 also
keeps a copy of each step's predictions on the GPU for metrics it means to compute at the end:
4 MiB a step (1024 x 1024 float32), ~560 MiB by the end. Rank 0 stays flat.

Expected of gpuprof (tests/gpu/validate_why.sh): one `growth` for rank 1's process, rank 1,
diagnosis tensors_kept_by_user_code, at `# why:keep` (the copy is made and kept on that line);
none for rank 0. With fewer than two GPUs each rank says it skips and exits 0. Each rank prints
one JSON line of facts at the end (why_common.facts).
"""
import os
import sys
import time

from why_common import DEVICE, SMOKE, Pace, allocated, facts, seconds, torch, where
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

KEEPING_RANK = 1


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))  # why:block


class Regressor(nn.Module):
    def __init__(self, d_in, width, depth, d_out):
        super().__init__()
        self.embed = nn.Linear(d_in, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, d_out)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x)))  # why:forward


def step(model, optimizer, x, y):
    out = model(x)
    loss = F.mse_loss(out, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return out, loss


def train(rank, model, optimizer, steps, batch, d_in, d_out):
    pace = Pace(0.05)
    predictions = []
    base = None
    last = float("nan")
    for i in range(steps):
        x = torch.randn(batch, d_in, device=DEVICE)
        y = torch.randn(batch, d_out, device=DEVICE)
        out, loss = step(model, optimizer, x, y)
        if rank == KEEPING_RANK:
            predictions.append(out.detach().clone())  # why:keep
        if i % 20 == 19:
            last = loss.item()
        if base is None:
            base = allocated() - sum(t.numel() * t.element_size() for t in predictions)
        pace.wait()
    return predictions, allocated() - base, last


def main():
    rank, local, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    if not SMOKE and torch.cuda.device_count() < 2:
        print(f"why_ddp.py rank {rank}: skipped: torch.cuda.device_count() is {torch.cuda.device_count()}, "
              "the DDP job needs 2 GPUs", flush=True)
        return 0
    if SMOKE:
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    d_in, width, depth, d_out = (256, 512, 4, 1024) if not SMOKE else (32, 64, 2, 1024)
    batch = 1024  # 1024 x 1024 float32 predictions: 4 MiB a step
    model = Regressor(d_in, width, depth, d_out).to(DEVICE)
    ddp = DistributedDataParallel(model, device_ids=[local] if DEVICE == "cuda" else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    duration = seconds(7.0)
    steps = max(int(duration / 0.05), 2)
    started = time.monotonic()
    predictions, kept, last = train(rank, ddp, optimizer, steps, batch, d_in, d_out)
    elapsed = time.monotonic() - started
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    lines = where(["keep", "forward", "block"])
    expect = ([{"kind": "growth", "diagnosis": "tensors_kept_by_user_code", "line": lines["keep"], "rank": rank}]
              if rank == KEEPING_RANK else [])
    facts("rank", rank=rank, local_rank=local, world_size=world, steps=steps, seconds=round(elapsed, 2),
          kept_tensors=len(predictions), kept_tensor_bytes=sum(t.numel() * t.element_size() for t in predictions),
          kept_bytes=kept, kept_bytes_per_second=round(kept / elapsed), last_loss=last, lines=lines, expect=expect)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
