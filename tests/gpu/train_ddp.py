"""One rank of a DDP job over NCCL (`torchrun --nproc-per-node N train_ddp.py`, validate_ddp.sh):
a small MLP trained for a few steps, gradients all-reduced by DDP. At the end each rank prints one
JSON line: its pid, rank, device and PyTorch's own figures for that device
(torch.cuda.memory_stats(device)), for comparison with what gpuprof saw per process and device."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = int(os.environ.get("STEPS", "20"))


def main():
    rank = int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    model = torch.nn.Sequential(
        torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    ddp = DistributedDataParallel(model, device_ids=[local])
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    for _ in range(STEPS):
        x = torch.randn(256, 4096, device="cuda")
        loss = ddp(x).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    dist.barrier()
    stats = torch.cuda.memory_stats(local)
    print(json.dumps({
        "pid": os.getpid(), "rank": rank, "device": local,
        "allocated": stats["allocated_bytes.all.current"], "reserved": stats["reserved_bytes.all.current"],
        "peak_allocated": stats["allocated_bytes.all.peak"], "alloc_count": stats["allocation.all.allocated"],
        "free_count": stats["allocation.all.freed"],
    }), flush=True)
    # Hold a moment so NVML can be read while every rank still lives.
    time.sleep(float(os.environ.get("HOLD", "2")))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
