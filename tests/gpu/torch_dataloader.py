"""A DataLoader whose spawned workers touch CUDA (a common mistake): each creates a context."""
import json
import os

import torch
from torch.utils.data import DataLoader, Dataset


class CudaTouchingDataset(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        # Wrong on purpose: a worker should return CPU tensors.
        return (torch.ones(4, device="cuda") * index).cpu()


if __name__ == "__main__":
    torch.cuda.init()
    model_input = torch.zeros(1, device="cuda")
    loader = DataLoader(CudaTouchingDataset(), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    total = sum(float(batch.sum()) for batch in loader)
    print(json.dumps({"parent_pid": os.getpid(), "total": total}))
