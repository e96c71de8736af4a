"""What the machine can do, asked of torch: whether it multiplies bf16 natively."""

from __future__ import annotations

import torch


def native_bf16() -> bool:
    """Whether this machine multiplies bf16 natively: a CUDA GPU that supports it, or a CPU with AVX512-BF16 or AMX.

    Elsewhere torch emulates bf16 products on the CPU, slower than float32, so `--auto_bf16` leaves them off.
    """
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    checks = (getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return any(check() for check in checks if check is not None)


__all__ = ["native_bf16"]
