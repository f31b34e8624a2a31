"""ops.c's fused per-token operations behind torch-facing wrappers: rms_norm and
silu_and_mul, each one vectorized pass instead of several torch ops (and their dispatch
overhead). fp32 CPU tensors."""

from __future__ import annotations

import torch

from minivllm.model.kernels import library


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, hidden], any strides (a per-head q/k norm gets a strided view of qkv)."""
    # The kernel reads and writes dense rows; empty_like would copy a view's strides.
    x = x.contiguous()
    out = torch.empty_like(x)
    library._library().rms_norm_f32(
        x=x.data_ptr(), weight=weight.data_ptr(), out=out.data_ptr(), rows=x.shape[0],
        cols=x.shape[1], eps=eps, num_threads=torch.get_num_threads())
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2 * n] = [gate | up] contiguous -> silu(gate) * up, [T, n]."""
    out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype, device=x.device)
    library._library().silu_and_mul_f32(
        x=x.data_ptr(), out=out.data_ptr(), rows=x.shape[0], half=x.shape[1] // 2,
        num_threads=torch.get_num_threads())
    return out
