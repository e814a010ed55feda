"""Shared by the GPU sweep scripts (kernels.py has its own, device-agnostic version)."""
import torch


def copy_bandwidth() -> float:
    """Device-to-device copy of 2 GiB on the current GPU: bytes read + written per second."""
    from triton.testing import do_bench

    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    return 2 * x.numel() / (do_bench(lambda: y.copy_(x), return_mode="median") * 1e-3)
