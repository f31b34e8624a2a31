"""bf16-stored linear weights with fp32 arithmetic (`dtype=bfloat16` on a CPU without bf16 dot
products: AVX2, AVX-512F without AVX512-BF16). The weights are rounded to bf16 and packed
once at load into bf16_gemm.c's panels; x stays fp32, each product is exact in fp32, and y
comes back in fp32 with bias and residual added in the same pass.

A decode step reads every weight once, so this halves fp32's bytes per token; against
oneDNN's bf16 linear, which such a CPU cannot run, and F.linear's emulated bf16 (slower than
fp32 there), nothing is rounded but the weights: a bf16 checkpoint computes as fp32 would on
its own values. The LM head can therefore be bf16 too (its logits stay fp32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.model.kernels import cpu


def pack_weight(weight: torch.Tensor, panel: int) -> torch.Tensor:
    """[N, K] -> bf16 [N/panel, K, panel/2, 2] (N padded with zero columns): per panel and k,
    word j (two bf16) holding column j and column j + panel/2."""
    n, k = weight.shape
    padded = F.pad(weight.to(torch.bfloat16), (0, 0, 0, -n % panel))
    return padded.view(-1, 2, panel // 2, k).permute(0, 3, 2, 1).contiguous()


def reference_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What the kernel computes before bias and residual, up to the summation order: fp32 x
    times the weights rounded to bf16, in fp32."""
    return F.linear(x.float(), weight.bfloat16().float())


def usable(weight: torch.Tensor, fast: bool) -> bool:
    """Where this layer runs: the CPU, with the C kernels at AVX2 or above."""
    return fast and weight.device.type == "cpu" and cpu.bf16_panel_width() > 0


class Bf16Linear:
    """y = x @ weight.T + bias (+ residual), weight stored in bf16. x: [T, in_features] fp32,
    2-D; y fp32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self.packed = pack_weight(weight, cpu.bf16_panel_width())
        self.bias = None if bias is None else bias.float().contiguous()

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return cpu.bf16_linear(x, self.packed, self.bias, residual, self.out_features)
