"""The training job bench/overhead.py measures: steps back to back, called from deep inside a
"framework" (nested calls, as a trainer library adds them), each step's start and end kept, until
the controller says stop on stdin. One process for the whole measurement, so that windows with
and without capture compare steps of the same process (between processes the plain step time
alone moves by ±15% on a GPU machine).

    overhead_job.py WORKLOAD [--depth N] [--out FILE]

WORKLOAD:
  encoder   6-layer transformer encoder, d_model 128, SGD: launch-bound, ~470 allocations a step
  gpt       GPT-style decoder, 12 layers, d_model 1024, bf16 autocast, AdamW: ~1,000 a step
  compiled  the encoder under torch.compile (inductor): fewer, larger allocations, little Python
  reports   bursts of 1,000 allocator reports (torch.empty and its free), 50,000 a second: the
            training thread's CPU per report
  standin   the same bursts through the libc10 stand-ins (no GPU: GPUPROF_LIBC10,
            GPUPROF_LIBC10_CUDA name them; GPUPROF_LIBCUDA and GPUPROF_LIBTORCH_CPU, stand-ins to load
            as well: a driver to attach to, autograd's thread-locals to read)

Prints "ready PID REPORTS_PER_STEP" once warm, then runs until a line "stop" (or end of input);
then writes FILE: {"steps": [[start_ns, end_ns, thread_cpu_ns], …], …} with CLOCK_MONOTONIC times.
"""

import array
import json
import os
import sys
import threading
import time


def arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


WORKLOAD = sys.argv[1]
DEPTH = int(arg("--depth", "20"))
OUT = arg("--out", "overhead_job.json")
BURST = 1000
BURST_PERIOD_S = BURST / 50_000


def torch_steps(kind):
    """A function doing one training step (synchronized), and the allocator reports it makes."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    if kind in ("encoder", "compiled"):
        layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, batch_first=True)
        model = nn.TransformerEncoder(layer, num_layers=6).cuda()
        x = torch.randn(8, 64, 128, device="cuda")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        forward = torch.compile(model) if kind == "compiled" else model

        def loss():
            return forward(x).sum()
    else:
        model = gpt(torch, nn, F).cuda()
        idx = torch.randint(0, 8192, (8, 256), device="cuda")
        targets = torch.randint(0, 8192, (8, 256), device="cuda")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def loss():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return model(idx, targets)

    def step():
        loss().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    for _ in range(30 if kind == "compiled" else 10):
        step()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(20):
        step()
    allocations = (torch.cuda.memory_stats()["allocation.all.allocated"] - before) / 20
    # An allocation and its free: two reports.
    return step, 2 * allocations


def gpt(torch, nn, F):
    class Attention(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = (p.view(b, t, self.heads, d // self.heads).transpose(1, 2) for p in self.qkv(x).split(d, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), Attention(d, heads), nn.LayerNorm(d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self, vocab=8192, d=1024, layers=12, heads=16, context=256):
            super().__init__()
            self.tokens, self.positions = nn.Embedding(vocab, d), nn.Embedding(context, d)
            self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

        def forward(self, idx, targets):
            x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return GPT()


def burst_steps(kind):
    """One step: a burst of BURST allocator reports (alloc and free of one block, alternating),
    then an idle rest to pace 50,000 reports a second."""
    if kind == "reports":
        import torch

        torch.empty(1 << 20, device="cuda")

        def burst():
            for _ in range(BURST // 2):
                torch.empty(4096, device="cuda")
    else:
        import ctypes

        class Device(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int8), ("index", ctypes.c_int8)]

        for optional in ("GPUPROF_LIBCUDA", "GPUPROF_LIBTORCH_CPU"):
            if optional in os.environ:
                ctypes.CDLL(os.environ[optional])
        ctypes.CDLL(os.environ["GPUPROF_LIBC10"])
        report = ctypes.CDLL(os.environ["GPUPROF_LIBC10_CUDA"]).standin_allocator_report
        report.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t, ctypes.c_size_t, Device]
        cuda = Device(1, 0)

        def burst():
            for i in range(BURST // 2):
                report(0x7F0000000000 + (i % 64) * 4096, 4096, 4096, 1 << 21, cuda)
                report(0x7F0000000000 + (i % 64) * 4096, -4096, 0, 1 << 21, cuda)

    def step():
        started = time.monotonic()
        burst()
        rest = BURST_PERIOD_S - (time.monotonic() - started)
        if rest > 0:
            time.sleep(rest)

    return step, BURST


def framework(depth, body):
    """`body` called DEPTH frames down, as a trainer library calls the user's step."""
    if depth == 0:
        return body()
    return framework(depth - 1, body)


def main():
    step, reports_per_step = (burst_steps if WORKLOAD in ("reports", "standin") else torch_steps)(WORKLOAD)
    stop = threading.Event()

    def listen():
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=listen, daemon=True).start()
    # Preallocated: appending a step costs no allocation of the job's own while it is measured.
    starts, ends, cpus = array.array("q"), array.array("q"), array.array("q")
    print(f"ready {os.getpid()} {reports_per_step:.1f}", flush=True)

    def run():
        while not stop.is_set():
            started = time.monotonic_ns()
            cpu = time.thread_time_ns()
            step()
            ends.append(time.monotonic_ns())
            starts.append(started)
            cpus.append(time.thread_time_ns() - cpu)

    framework(DEPTH, run)
    with open(OUT, "w") as out:
        json.dump(
            {
                "workload": WORKLOAD,
                "reports_per_step": reports_per_step,
                "steps": [[s, e, c] for s, e, c in zip(starts, ends, cpus)],
            },
            out,
        )


main()
