"""A running PyTorch process to attach to: prints "ready", then allocates and frees segments."""
import sys
import time

import torch

torch.cuda.init()
torch.empty(1, device="cuda")
print("ready", flush=True)
deadline = time.time() + float(sys.argv[1] if len(sys.argv) > 1 else 20)
step = 0
while time.time() < deadline:
    t = torch.empty((1 + step % 8) << 20, dtype=torch.uint8, device="cuda")
    del t
    torch.cuda.empty_cache()
    step += 1
    time.sleep(0.01)
