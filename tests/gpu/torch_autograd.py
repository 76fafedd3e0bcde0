"""Training steps whose backward pass allocates on autograd's threads, for backward attribution.

    torch_autograd.py --model loop|gpt [--steps N] [--truth FILE]

loop: the allocator benchmark's model (6-layer transformer encoder, d_model 128, AdamW).
gpt:  a GPT-style decoder written out in Python (12 layers, d_model 1024, 16 heads, bf16
      autocast, sequence 256, batch 8, AdamW).

Prints one JSON line: the median step time (ms) after 5 warm-up steps and when the steps ended
(wall-clock ns). With --truth, one more step follows in anomaly mode, which keeps each autograd
node's forward traceback: FILE gets, per node of that step's graph, its sequence number, class
and the innermost forward frame (file, line, function), then that step's backward runs.
"""
import json
import re
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, d)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        h = F.gelu(self.fc(self.ln2(x)))
        return x + self.out(h)


class GPT(nn.Module):
    def __init__(self, vocab=8192, d=1024, layers=12, heads=16, context=256):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.tokens(idx) + self.positions(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make(kind):
    if kind == "loop":
        layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, batch_first=True)
        model = nn.TransformerEncoder(layer, num_layers=6).cuda()
        x = torch.randn(8, 64, 128, device="cuda")
        return model, (lambda: model(x).sum()), None
    model = GPT().cuda()
    idx = torch.randint(0, 8192, (8, 256), device="cuda")
    targets = torch.randint(0, 8192, (8, 256), device="cuda")

    def loss():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return model(idx, targets)
    return model, loss, torch.bfloat16


def step(loss_of, optimizer):
    loss = loss_of()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def graph_truth(loss):
    """Every node of the graph: sequence number → class and innermost forward frame (anomaly
    mode's traceback: a list of '  File "F", line N, in FUNC' entries, innermost last)."""
    nodes, seen, todo = {}, set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        frame = None
        trace = node.metadata.get("traceback_")
        if trace:
            found = re.search(r'File "(.*)", line (\d+), in (.*)', trace[-1])
            frame = {"file": found[1], "line": int(found[2]), "function": found[3]} if found else None
        nodes[node._sequence_nr()] = {"node": node.name(), "frame": frame}
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    return nodes


def main():
    kind = arg("--model", "loop")
    steps = int(arg("--steps", "50"))
    model, loss_of, _ = make(kind)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for i in range(steps + 5):
        start = time.perf_counter()
        step(loss_of, optimizer)
        torch.cuda.synchronize()
        if i >= 5:
            times.append((time.perf_counter() - start) * 1000)
    ended = time.time_ns()
    truth = arg("--truth", None)
    if truth:
        with torch.autograd.detect_anomaly(check_nan=False):
            loss = loss_of()
            nodes = graph_truth(loss)
            with open(truth, "w") as out:
                json.dump({str(k): v for k, v in nodes.items()}, out)
            loss.backward()
        torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    print(json.dumps({"model": kind, "median_ms": statistics.median(times), "steps": steps + 5, "ended_ns": ended,
                      "allocations_per_step": stats["allocation.all.allocated"] / (steps + 5),
                      "allocations": stats["allocation.all.allocated"], "allocated_bytes": stats["allocated_bytes.all.allocated"]}))
    # Node classes are read from the process's memory while it lives.
    time.sleep(1)


if __name__ == "__main__":
    main()
