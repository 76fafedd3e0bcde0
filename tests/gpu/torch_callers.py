"""Driver calls from the libraries PyTorch uses: a training step (cuBLAS), and NCCL's
communicator (one rank) doing an all-reduce. gpuprof names the module of each driver call."""
import json
import os

import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29517")
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
optimizer = torch.optim.AdamW(model.parameters())
for _ in range(5):
    loss = model(torch.randn(256, 1024, device="cuda")).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
t = torch.ones(1 << 20, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
stats = torch.cuda.memory_stats()
print(json.dumps({"pid": os.getpid(), "allocated": stats["allocated_bytes.all.current"], "reserved": stats["reserved_bytes.all.current"],
                  "all_reduce": t[0].item()}), flush=True)
dist.destroy_process_group()
