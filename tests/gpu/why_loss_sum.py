"""A regression model trained for SECONDS (default 7) that checks a held-out batch every second
step and sums those validation losses as tensors, for their mean at the end: validate() runs
without torch.no_grad(), so each loss carries its forward's graph, and `val_total = val_total +
loss` keeps every one of them alive (~5 MiB of saved activations a validation, ~330 MiB by the
end). The training step itself is healthy.

    why_loss_sum.py [SECONDS]

Expected of gpuprof (tests/gpu/validate_why.sh): one `growth`, diagnosis autograd_graph_retained,
at Block.forward's line (`# why:block`, the innermost line of this file under the kept blocks);
the graph is kept at `# why:sum`. Prints one JSON line of facts at the end (why_common.facts).
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
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


def validate(model, x, y):
    return F.mse_loss(model(x), y)  # why:validate  (no torch.no_grad(): a graph every call)


def train(model, optimizer, val_x, val_y, duration, batch, d_in, d_out):
    pace = Pace(0.05)
    val_total = torch.zeros((), device=DEVICE)
    steps = validations = 0
    base = None
    last = float("nan")
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        x = torch.randn(batch, d_in, device=DEVICE)
        y = torch.randn(batch, d_out, device=DEVICE)
        loss = step(model, optimizer, x, y)
        steps += 1
        if steps % 20 == 0:
            last = loss.item()
        if base is None:
            base = allocated()  # the optimizer's state exists from here on
        if steps % 2 == 0:
            i = validations % len(val_x)
            val_total = val_total + validate(model, val_x[i], val_y[i])  # why:sum
            validations += 1
        pace.wait()
    return steps, validations, val_total, allocated() - base, last


def main():
    d_in, width, depth, d_out = (256, 512, 4, 256) if not SMOKE else (32, 64, 2, 32)
    batch, val_batch = 256, 64
    model = Regressor(d_in, width, depth, d_out).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    val_x = torch.randn(16, val_batch, d_in, device=DEVICE)
    val_y = torch.randn(16, val_batch, d_out, device=DEVICE)
    started = time.monotonic()
    steps, validations, val_total, kept, last = train(
        model, optimizer, val_x, val_y, seconds(7.0), batch, d_in, d_out)
    elapsed = time.monotonic() - started
    lines = where(["block", "blocks", "head", "validate", "sum"])
    facts("trainer", steps=steps, validations=validations, seconds=round(elapsed, 2),
          kept_bytes=kept, kept_bytes_per_second=round(kept / elapsed), last_loss=last,
          mean_val_loss=(val_total / max(validations, 1)).item(), lines=lines,
          expect=[{"kind": "growth", "diagnosis": "autograd_graph_retained", "line": lines["block"],
                   "also": {"graph kept at": lines["sum"], "validation forward": lines["validate"]}}])


if __name__ == "__main__":
    main()
