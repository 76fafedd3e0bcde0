"""One rank of a DDP job over gloo, every rank on the machine's first GPU (a job of four ranks on
one GPU, started by validate_job.sh as two "nodes" of two ranks each): a small MLP trained for a
few steps; with KEEP_RANK set, that rank keeps a 32 MiB tensor every step. Then each rank writes
one JSON line to RANKS_OUT (its pid, rank, torch.cuda.memory_allocated() and the kept line) and
holds its memory HOLD seconds, so the collector's view can be read while every rank lives."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = int(os.environ.get("STEPS", "30"))
MiB = 1 << 20


def keep_for_later(kept):
    kept.append(torch.empty(32 * MiB, dtype=torch.uint8, device="cuda"))  # KEEP


def main():
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)
    dist.init_process_group("gloo")
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    keeper = rank == int(os.environ.get("KEEP_RANK", "-1"))
    kept = []
    for _ in range(STEPS):
        x = torch.randn(128, 2048, device="cuda")
        loss = ddp(x).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if keeper:
            keep_for_later(kept)
        time.sleep(0.1)
    torch.cuda.synchronize()
    dist.barrier()
    keep_line = next(n for n, line in enumerate(open(__file__), 1) if line.rstrip().endswith("# KEEP"))
    with open(os.environ["RANKS_OUT"], "a") as out:
        out.write(json.dumps({
            "pid": os.getpid(), "rank": rank, "allocated": torch.cuda.memory_allocated(0),
            "reserved": torch.cuda.memory_reserved(0), "kept": len(kept), "keep_line": keep_line,
        }) + "\n")
    time.sleep(float(os.environ.get("HOLD", "12")))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
