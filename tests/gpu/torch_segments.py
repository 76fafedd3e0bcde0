"""Allocates and frees through PyTorch's caching allocator, then prints its own counters.

Used by validate_capture.sh on a GPU machine: gpuprof's cuMemAlloc/cuMemFree (or, with
expandable_segments, cuMemCreate/cuMemRelease) events must agree with these numbers.
"""
import json
import os

import torch

torch.cuda.init()
tensors = []
for mib in (1, 3, 10, 25, 100, 300):
    tensors.append(torch.empty(mib << 20, dtype=torch.uint8, device="cuda"))
for _ in range(100):
    tensors.append(torch.empty(1000, device="cuda"))
del tensors
torch.cuda.synchronize()
torch.cuda.empty_cache()
a = torch.randn(4096, 4096, device="cuda")
b = a @ a
del a, b
torch.cuda.synchronize()
torch.cuda.empty_cache()
stats = torch.cuda.memory_stats()
keys = ("segment.all.allocated", "segment.all.freed", "allocation.all.allocated", "allocation.all.freed",
        "reserved_bytes.all.peak", "reserved_bytes.all.current")
print(json.dumps({"pid": os.getpid(), "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                  **{k: stats[k] for k in keys}}))
