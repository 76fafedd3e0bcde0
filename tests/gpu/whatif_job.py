"""The jobs `gpuprof whatif` is validated with: each under whatever PYTORCH_CUDA_ALLOC_CONF it is
started with, and one JSON line of PyTorch's own counters at the end.

    whatif_job.py gpt|encoder|fragment|halves [--steps N] [--history FILE]

--history: PyTorch's own memory history of the run (`_record_memory_history`), pickled to FILE, to
see what the allocator did step by step where a replay parts from it.

gpt:      the GPT-style decoder of torch_autograd.py (12 layers, d_model 1024, bf16 autocast,
          AdamW) trained on batches whose sequence length changes every step (64..512), as
          packed variable-length data does.
fragment: fills the card with 4 MiB blocks, keeps one in five (one per 20 MiB segment), then asks
          for 8 GiB: out of memory with tens of GiB reserved but unallocated, under every setting.
encoder:  torch.nn.TransformerEncoder (8 layers, d_model 512) over batches of changing shape.
halves:   step i asks for a buffer of 512 + 2i MiB, frees it, and keeps a block of just over half
          its size: the default settings leave each segment half used and run out of memory;
          expandable segments grow one segment by the kept half only; max_split_size_mb keeps the
          big blocks whole and gives them back when the card is full.

Out of memory is caught: the line says at which step it happened (PyTorch's message included).
"""
import json
import os
import random
import sys

import torch
import torch.nn as nn

from torch_autograd import GPT

MIB = 1 << 20


def arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def gpt(steps):
    shapes = random.Random(7)
    model = GPT(context=512).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(steps):
        t = shapes.choice([64, 128, 192, 256, 320, 384, 448, 512])
        idx = torch.randint(0, 8192, (8, t), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx, idx)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def encoder(steps):
    shapes = random.Random(11)
    layer = nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=8).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        batch, length = shapes.choice([16, 24, 32]), shapes.randrange(64, 513, 32)
        x = torch.randn(batch, length, 512, device="cuda")
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def fragment(_steps):
    free, _total = torch.cuda.mem_get_info()
    blocks = [torch.empty(4 * MIB, dtype=torch.uint8, device="cuda") for _ in range((free - 2048 * MIB) // (4 * MIB))]
    kept = blocks[::5]
    del blocks
    return kept, torch.empty(8192 * MIB, dtype=torch.uint8, device="cuda")


def halves(steps):
    kept = []
    for step in range(steps):
        size = (512 + 2 * step) * MIB
        buffer = torch.empty(size, dtype=torch.uint8, device="cuda")
        del buffer
        kept.append(torch.empty(size // 2 + MIB, dtype=torch.uint8, device="cuda"))
    return kept


JOBS = {"gpt": (gpt, 30), "encoder": (encoder, 60), "fragment": (fragment, 1), "halves": (halves, 150)}

if __name__ == "__main__":
    name = sys.argv[1]
    job, default_steps = JOBS[name]
    torch.cuda.init()
    if "--history" in sys.argv:
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=2_000_000)
    facts = {"job": name, "pid": os.getpid(), "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    try:
        job(int(arg("--steps", default_steps)))
        facts["out_of_memory"] = None
    except torch.OutOfMemoryError as error:
        facts["out_of_memory"] = str(error).splitlines()[0][:400]
    stats = torch.cuda.memory_stats()
    for key in ("reserved_bytes.all.peak", "allocated_bytes.all.peak", "reserved_bytes.all.current",
                "allocation.all.allocated", "segment.all.allocated", "num_alloc_retries", "num_ooms"):
        facts[key] = stats.get(key)
    if "--history" in sys.argv:
        torch.cuda.memory._dump_snapshot(arg("--history", None))
    print(json.dumps(facts), flush=True)
