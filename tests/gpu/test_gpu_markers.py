"""pytest --gpuprof on real PyTorch (validate_first_run.sh): two tests that should fail (a leak,
a limit) and two that should pass."""
import pytest
import torch

kept = []


@pytest.mark.gpu_leak_free
def test_leaks_a_tensor():
    kept.append(torch.empty(32 << 20, dtype=torch.uint8, device="cuda"))  # line:leak


@pytest.mark.gpu_leak_free
def test_frees_what_it_allocates():
    x = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    del x


@pytest.mark.limit_gpu_memory("100 MiB")
def test_over_the_limit():
    x = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # line:limit
    del x


@pytest.mark.limit_gpu_memory("100 MiB")
def test_under_the_limit():
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    del x
