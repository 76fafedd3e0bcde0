"""PyTorch's profiler with profile_memory=True around a few steps: its memory records come
through c10::reportMemoryUsageToProfiler, so an interposing shim must forward every call.

Prints JSON: the profiler's memory records (allocations, frees) and memory_stats() counts.
"""
import json

import torch
from torch.profiler import ProfilerActivity, profile

model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(3)]).cuda()
torch.cuda.synchronize()
before = torch.cuda.memory_stats()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True) as prof:
    for _ in range(3):
        x = torch.randn(64, 256, device="cuda")
        model(x).sum().backward()
    torch.cuda.synchronize()
after = torch.cuda.memory_stats()
memory = [e for e in prof.events() if e.name == "[memory]"]
# A CUDA allocator record carries device bytes (cuda_memory_usage before PyTorch 2.1).
cuda_memory = [e for e in memory if getattr(e, "device_memory_usage", getattr(e, "cuda_memory_usage", 0))]
print(json.dumps({
    "profiler_memory_records": len(memory),
    "profiler_cuda_memory_records": len(cuda_memory),
    "torch_allocations": after["allocation.all.allocated"] - before["allocation.all.allocated"],
    "torch_frees": after["allocation.all.freed"] - before["allocation.all.freed"],
}))
