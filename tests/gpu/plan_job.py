"""The job `gpuprof whatif --scale` is validated with: Hugging Face transformers' GPT-2 (built
from its config, 12 layers, d 768, 2,048 positions, eager attention whose scores grow with the square of the
length), AdamW, bf16 autocast, STEPS training steps on batches of fixed shape. One JSON line of
PyTorch's own counters at the end (out of memory caught and said).

    plan_job.py BATCH SEQ [--steps N] [--fraction F]

--fraction: torch.cuda.set_per_process_memory_fraction(F) first, a smaller device emulated.
"""
import json
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def train(batch, seq, steps):
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=2048, attn_implementation="eager")
    model = GPT2LMHeadModel(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator(device="cuda").manual_seed(3)
    for _ in range(steps):
        idx = torch.randint(0, config.vocab_size, (batch, seq), device="cuda", generator=generator)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=idx, labels=idx).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def main():
    batch, seq = int(sys.argv[1]), int(sys.argv[2])
    fraction = float(arg("--fraction", "0"))
    if fraction:
        torch.cuda.set_per_process_memory_fraction(fraction)
    oom = None
    try:
        train(batch, seq, int(arg("--steps", "3")))
    except torch.cuda.OutOfMemoryError as error:
        oom = str(error).splitlines()[0]
    stats = torch.cuda.memory_stats()
    print(json.dumps({
        "batch": batch,
        "seq": seq,
        "fraction": fraction,
        "total": torch.cuda.get_device_properties(0).total_memory,
        "reserved_peak": stats["reserved_bytes.all.peak"],
        "allocated_peak": stats["allocated_bytes.all.peak"],
        "requests": stats["allocation.all.allocated"],
        "retries": stats["num_alloc_retries"],
        "out_of_memory": oom,
    }), flush=True)


main()
