"""PyTorch jobs whose GPU memory goes wrong the way real jobs' does, one per run, for the
findings' validation on a GPU (tests/gpu/validate_stories.sh):

    torch_stories.py eval-oom | autograd-keeps | ipc-consumer | worker-pool | orphans

eval-oom        an evaluation loop without torch.no_grad() sums its losses as tensors (every
                step's graph kept) next to a neighbour process whose allocator caches most of the
                GPU: OutOfMemoryError
autograd-keeps  a custom autograd Function that keeps its inputs in a module-level list
ipc-consumer    a consumer that receives CUDA tensors from a producer and exits holding them
worker-pool     a spawn Pool whose workers keep a CUDA tensor per task
orphans         a launcher with CUDA spawns two workers holding 1 GiB each, then is killed with
                SIGKILL; the workers live on for 20 s

Each process prints one JSON line with its pid, its role and torch.cuda.memory_stats() figures.
"""
import json
import os
import signal
import sys
import time

import torch
import torch.multiprocessing as mp

GiB = 1 << 30


def say(role, **fields):
    stats = torch.cuda.memory_stats() if torch.cuda.is_initialized() else {}
    print(json.dumps({"pid": os.getpid(), "role": role, "allocated": stats.get("allocated_bytes.all.current"),
                      "reserved": stats.get("reserved_bytes.all.current"), **fields}), flush=True)


# -- eval-oom ---------------------------------------------------------------------------------
def neighbour(ready, done, cache_gib):
    held = torch.empty(int(cache_gib * GiB), dtype=torch.uint8, device="cuda")
    del held  # into the caching allocator, which keeps the segment
    say("neighbour")
    ready.set()
    done.wait(300)


def evaluate(model, batch):
    total = 0
    with torch.autocast("cuda", enabled=False):
        for _step in range(10_000):
            x = torch.randn(batch, 4096, device="cuda")
            loss = model(x).square().mean()  # line:eval-forward
            total = total + loss  # the graph of every step stays alive through `total`
            time.sleep(0.5)
    return total


def eval_oom():
    # The neighbour starts first: another job on the GPU, not a worker of this one.
    ready, done = mp.Event(), mp.Event()
    other = mp.Process(target=neighbour, args=(ready, done, 60))
    other.start()
    ready.wait(300)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda()
    try:
        evaluate(model, 8192)
    except torch.OutOfMemoryError as error:
        say("evaluator", oom=str(error).split("\n")[0][:800])
    done.set()
    other.join()


# -- autograd-keeps ---------------------------------------------------------------------------
KEPT = []


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        y = x * 2  # line:function-forward
        KEPT.append(y)  # kept after the step: nothing ever clears the list
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def autograd_keeps():
    model = torch.nn.Linear(2048, 2048).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    deadline = time.time() + 20
    while time.time() < deadline:
        x = torch.randn(4096, 2048, device="cuda")
        loss = Scale.apply(model(x)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.1)
    say("trainer", kept=len(KEPT))


# -- ipc-consumer -----------------------------------------------------------------------------
def consumer(queue, done):
    received = [queue.get() for _ in range(4)]  # CUDA tensors from the producer, kept
    say("consumer", received=len(received))
    done.set()
    os._exit(0)  # exits holding them: no cuIpcCloseMemHandle


def ipc_consumer():
    queue, done = mp.Queue(), mp.Event()
    worker = mp.Process(target=consumer, args=(queue, done))
    worker.start()
    tensors = [torch.full((64 << 20,), i, dtype=torch.uint8, device="cuda") for i in range(4)]
    for t in tensors:
        queue.put(t)
    done.wait(300)
    worker.join()
    say("producer")
    time.sleep(1)


# -- worker-pool ------------------------------------------------------------------------------
CACHE = []


def task(i):
    CACHE.append(torch.ones(64 << 20, dtype=torch.uint8, device="cuda"))  # line:pool-task
    time.sleep(0.2)
    return os.getpid(), len(CACHE)


def worker_pool():
    with mp.Pool(2) as pool:
        results = pool.map(task, range(100), chunksize=1)
    say("pool-parent", workers=sorted({pid for pid, _ in results}))


# -- orphans ----------------------------------------------------------------------------------
def orphan(ready, parent):
    kept = torch.empty(GiB, dtype=torch.uint8, device="cuda")  # line:orphan
    say("worker")
    ready.set()
    deadline = time.time() + 20
    while time.time() < deadline or os.getppid() == parent:
        time.sleep(0.1)
    del kept


def orphans():
    torch.empty(2 << 20, device="cuda")
    events = [mp.Event(), mp.Event()]
    workers = [mp.Process(target=orphan, args=(event, os.getpid())) for event in events]
    for w in workers:
        w.start()
    for event in events:
        event.wait(300)
    say("launcher")
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    mp.set_start_method("spawn")
    {"eval-oom": eval_oom, "autograd-keeps": autograd_keeps, "ipc-consumer": ipc_consumer,
     "worker-pool": worker_pool, "orphans": orphans}[sys.argv[1]]()
