"""torch.multiprocessing: a CUDA tensor shared with a spawned worker (legacy IPC handles)."""
import json
import os

import torch
import torch.multiprocessing as mp


def worker(tensor, queue):
    queue.put({"child_pid": os.getpid(), "sum": float(tensor.sum())})


if __name__ == "__main__":
    mp.set_start_method("spawn")
    shared = torch.ones(1 << 20, device="cuda")
    queue = mp.Queue()
    process = mp.Process(target=worker, args=(shared, queue))
    process.start()
    result = queue.get()
    process.join()
    print(json.dumps({"parent_pid": os.getpid(), "child_exit": process.exitcode, **result}))
