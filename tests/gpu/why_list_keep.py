"""A healthy training loop (forward, backward, optimizer step) for SECONDS (default 7) that keeps
every step's predictions, detached, in a Python list for an analysis at the end: one 1 MiB output
of the model a step (256 x 1024 float32), ~140 MiB by the end. The graph is freed by backward;
the list holds the output's block.

    why_list_keep.py [SECONDS]

Expected of gpuprof (tests/gpu/validate_why.sh): one `growth`, diagnosis tensors_kept_by_user_code,
at the line that allocated the kept output, Regressor.forward's head line (`# why:head`); the list
keeps it at `# why:append`. Prints one JSON line of facts at the end (why_common.facts).
"""
import time

from why_common import DEVICE, SMOKE, Pace, allocated, facts, seconds, torch, where
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))  # why:block


class Regressor(nn.Module):
    def __init__(self, d_in, width, depth, d_out):
        super().__init__()
        self.embed = nn.Linear(d_in, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, d_out)

    def forward(self, x):
        h = self.blocks(self.embed(x))  # why:blocks
        return self.head(h)  # why:head


def step(model, optimizer, x, y):
    out = model(x)  # why:forward
    loss = F.mse_loss(out, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return out, loss


def train(model, optimizer, duration, batch, d_in, d_out):
    pace = Pace(0.05)
    history = []
    steps = 0
    base = None
    last = float("nan")
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        x = torch.randn(batch, d_in, device=DEVICE)
        y = torch.randn(batch, d_out, device=DEVICE)
        out, loss = step(model, optimizer, x, y)
        history.append(out.detach())  # why:append
        steps += 1
        if steps % 20 == 0:
            last = loss.item()
        if base is None:
            base = allocated() - out.numel() * out.element_size()
        pace.wait()
    return steps, history, allocated() - base, last


def main():
    d_in, width, depth, d_out = (256, 512, 4, 1024) if not SMOKE else (32, 64, 2, 1024)
    batch = 256  # 256 x 1024 float32 outputs: 1 MiB a step
    model = Regressor(d_in, width, depth, d_out).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    started = time.monotonic()
    steps, history, kept, last = train(model, optimizer, seconds(7.0), batch, d_in, d_out)
    elapsed = time.monotonic() - started
    lines = where(["head", "append", "forward", "block", "blocks"])
    facts("trainer", steps=steps, seconds=round(elapsed, 2), kept_tensors=len(history),
          kept_tensor_bytes=sum(t.numel() * t.element_size() for t in history), kept_bytes=kept,
          kept_bytes_per_second=round(kept / elapsed), last_loss=last, lines=lines,
          expect=[{"kind": "growth", "diagnosis": "tensors_kept_by_user_code", "line": lines["head"],
                   "also": {"kept by the list at": lines["append"], "model called at": lines["forward"]}}])


if __name__ == "__main__":
    main()
