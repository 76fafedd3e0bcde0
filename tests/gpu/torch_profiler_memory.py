"""PyTorch's profiler with profile_memory=True around a few steps: its memory records come
through c10::reportMemoryUsageToProfiler, so an interposing shim must forward every call.

Prints JSON: the profiler's memory records (allocations, frees) and memory_stats() counts.
"""
import json
import os

import torch
from torch.profiler import ProfilerActivity, profile

# PROFILE_FROM_START=1: the profiler (Kineto, a CUPTI client) starts before CUDA is initialized.
from_start = bool(os.environ.get("PROFILE_FROM_START"))
prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True)
if from_start:
    prof.__enter__()
model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(3)]).cuda()
torch.cuda.synchronize()
before = torch.cuda.memory_stats()
if not from_start:
    prof.__enter__()
for _ in range(3):
    x = torch.randn(64, 256, device="cuda")
    model(x).sum().backward()
torch.cuda.synchronize()
prof.__exit__(None, None, None)
after = torch.cuda.memory_stats()
memory = [e for e in prof.events() if e.name == "[memory]"]
# A CUDA allocator record carries device bytes (cuda_memory_usage before PyTorch 2.1).
cuda_memory = [e for e in memory if getattr(e, "device_memory_usage", getattr(e, "cuda_memory_usage", 0))]
# Kernels on the GPU: what Kineto's CUPTI activity tracing adds to the profile.
kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
print(json.dumps({
    "profiler_memory_records": len(memory),
    "profiler_cuda_kernel_events": len(kernels),
    "profiler_cuda_memory_records": len(cuda_memory),
    "torch_allocations": after["allocation.all.allocated"] - before["allocation.all.allocated"],
    "torch_frees": after["allocation.all.freed"] - before["allocation.all.freed"],
}))
