"""Another job on the same GPU, for why_eval_oom.py: it allocates GIB (default 20) of tensors and
frees them, so PyTorch's caching allocator keeps that memory reserved but unused (its cache),
prints its facts as one JSON line, then waits until its standard input closes (the evaluator ends
it so) or 300 s pass, and prints its facts again.

    why_neighbour.py [GIB]
"""
import select
import sys

from why_common import DEVICE, GiB, MiB, SMOKE, facts, torch, where


def hold_cache(size):
    block = torch.empty(size, dtype=torch.uint8, device=DEVICE)  # why:cache
    block.fill_(1)
    del block  # back to the caching allocator, which keeps the segment: reserved, not allocated


def main():
    gib = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    size = 16 * MiB if SMOKE else int(gib * GiB)
    hold_cache(size)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    facts("neighbour", cached_bytes=size, lines=where(["cache"]))
    select.select([sys.stdin], [], [], 300)
    facts("neighbour at its end", cached_bytes=size)


if __name__ == "__main__":
    main()
