"""A healthy training job for SECONDS (default 7): forward, backward, optimizer and scheduler steps,
the loss logged as a Python float, and an evaluation on held-out batches every 25 steps under
torch.no_grad() whose losses are summed with .item(). Its memory rises during the first step
(the optimizer's state, the allocator's cache) and stays flat after.

    why_healthy.py [SECONDS]

Expected of gpuprof (tests/gpu/validate_why.sh): no `growth` and no other leak; an
`exit_with_live_allocations` of severity info at its exit is a fact, not a leak. Prints one JSON
line of facts at the end (why_common.facts).
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


class Classifier(nn.Module):
    def __init__(self, d_in, width, depth, classes):
        super().__init__()
        self.embed = nn.Linear(d_in, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = self.blocks(self.embed(x))
        return self.head(h)


def step(model, optimizer, scheduler, x, y):
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss


def evaluate(model, batches):
    model.eval()
    total = correct = seen = 0
    with torch.no_grad():  # why:no_grad
        for x, y in batches:
            logits = model(x)
            total += F.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
            seen += len(y)
    model.train()
    return total / seen, correct / seen


def train(model, optimizer, scheduler, held_out, duration, batch, d_in, classes):
    pace = Pace(0.05)
    steps = evaluations = 0
    losses, scores = [], []
    after_first = None
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        x = torch.randn(batch, d_in, device=DEVICE)
        y = torch.randint(classes, (batch,), device=DEVICE)
        loss = step(model, optimizer, scheduler, x, y)
        losses.append(loss.item())
        steps += 1
        if after_first is None:
            after_first = allocated()
        if steps % 25 == 0:
            scores.append(evaluate(model, held_out))
            evaluations += 1
        pace.wait()
    return steps, evaluations, losses, scores, allocated() - after_first


def main():
    d_in, width, depth, classes = (256, 512, 4, 100) if not SMOKE else (32, 64, 2, 10)
    batch = 256
    model = Classifier(d_in, width, depth, classes).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=1000)
    held_out = [(torch.randn(512, d_in, device=DEVICE), torch.randint(classes, (512,), device=DEVICE))
                for _ in range(4)]
    started = time.monotonic()
    steps, evaluations, losses, scores, change = train(
        model, optimizer, scheduler, held_out, seconds(7.0), batch, d_in, classes)
    elapsed = time.monotonic() - started
    facts("trainer", steps=steps, evaluations=evaluations, seconds=round(elapsed, 2),
          allocated_change_after_first_step=change, last_loss=losses[-1] if losses else None,
          last_eval=scores[-1] if scores else None, lines=where(["block", "no_grad"]), expect=[])


if __name__ == "__main__":
    main()
