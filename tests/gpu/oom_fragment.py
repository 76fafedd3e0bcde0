"""A job that runs out of GPU memory by fragmentation, for the node daemon's post-mortem
(tests/gpu/validate_always_on.sh): it trains a small model for SECONDS (default 20) so that its
last minute holds more than the failure, then fills the card with 4 MiB blocks, keeps one in five
(one per 20 MiB segment: every segment stays in use) and asks for 8 GiB: out of memory with tens
of GiB reserved but unallocated. At the failure it prints one JSON line of PyTorch's own figures
(torch.cuda.memory_stats(): allocated and reserved bytes, segments, the failed request's line),
then exits 1.

    oom_fragment.py [SECONDS]
"""

import json
import os
import sys
import time

import torch
import torch.nn as nn

MIB = 1 << 20


def train(seconds):
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        loss = model(torch.randn(256, 512, device="cuda")).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        time.sleep(0.05)
    return model, optimizer


def fragment():
    free, _total = torch.cuda.mem_get_info()
    blocks = [torch.empty(4 * MIB, dtype=torch.uint8, device="cuda") for _ in range((free - 2048 * MIB) // (4 * MIB))]
    kept = blocks[::5]
    del blocks
    return kept


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    model, optimizer = train(seconds)
    kept = fragment()
    line = next(n for n, text in enumerate(open(__file__), 1) if text.rstrip().endswith("# the failing request"))
    try:
        big = torch.empty(8192 * MIB, dtype=torch.uint8, device="cuda")  # the failing request
    except torch.OutOfMemoryError as error:
        stats = torch.cuda.memory_stats()
        print(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "role": "oom",
                    "request_line": line,
                    "kept_blocks": len(kept),
                    "allocated_bytes": stats["allocated_bytes.all.current"],
                    "reserved_bytes": stats["reserved_bytes.all.current"],
                    "segments": stats["segment.all.current"],
                    "num_alloc_retries": stats["num_alloc_retries"],
                    "num_ooms": stats["num_ooms"],
                    "error": str(error).splitlines()[0][:300],
                }
            ),
            flush=True,
        )
        sys.exit(1)
    print(json.dumps({"pid": os.getpid(), "role": "oom", "unexpected": "no out of memory", "bytes": big.numel()}))


if __name__ == "__main__":
    main()
