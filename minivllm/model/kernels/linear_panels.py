"""Linear layers over weights packed once at load into panel_gemm.c's panels, fp32
arithmetic, fp32 x and y (bias and residual added in the same pass):

- bf16-stored weights (`dtype=bfloat16` on a CPU without bf16 dot products: AVX2, AVX-512F
  without AVX512-BF16). A decode step reads every weight once, so this halves fp32's bytes
  per token; against oneDNN's bf16 linear, which such a CPU cannot run, and F.linear's
  emulated bf16 (slower than fp32 there), nothing is rounded but the weights: a bf16
  checkpoint computes as fp32 would on its own values. The LM head can therefore be bf16
  too (its logits stay fp32).
- fp32 weights: one of the ways an fp32 linear can run, beside oneDNN's and torch's
  (layers.linear_ways); `--kernel-choice measure` runs it for the row counts where it is
  the fastest measured (a decode step's few rows, where each weight vector it loads feeds
  every row of a tile).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.model.kernels import cpu


def pack_weight(weight: torch.Tensor, panel: int, stored: torch.dtype) -> torch.Tensor:
    """[N, K] -> panels of `panel` columns, N padded with zero columns. fp32: [N/panel, K,
    panel]; bf16: [N/panel, K, panel/2, 2], per panel and k word j (two bf16) holding column
    j and column j + panel/2."""
    n, k = weight.shape
    padded = F.pad(weight.to(stored), (0, 0, 0, -n % panel))
    if stored == torch.float32:
        return padded.view(-1, panel, k).transpose(1, 2).contiguous()
    return padded.view(-1, 2, panel // 2, k).permute(0, 3, 2, 1).contiguous()


def reference_linear(x: torch.Tensor, weight: torch.Tensor,
                     stored: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """What the kernel computes before bias and residual, up to the summation order: fp32 x
    times the weights as stored, in fp32."""
    return F.linear(x.float(), weight.to(stored).float())


def usable(weight: torch.Tensor, fast: bool) -> bool:
    """Where this layer runs: the CPU, with the C kernels at AVX2 or above."""
    return fast and weight.device.type == "cpu" and cpu.panel_width() > 0


class PanelLinear:
    """y = x @ weight.T + bias (+ residual), weight stored as `stored` (torch.bfloat16 or
    torch.float32). x: [T, in_features] fp32, 2-D; y fp32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 stored: torch.dtype = torch.bfloat16) -> None:
        self.out_features, self.in_features = weight.shape
        self.packed = pack_weight(weight, cpu.panel_width(), stored)
        self.bias = None if bias is None else bias.float().contiguous()

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return cpu.panel_linear(x, self.packed, self.bias, residual, self.out_features)
