"""Linear layers over weights packed once at load into panel_gemm.c's panels, fp32
arithmetic, fp32 x and y (bias and residual added in the same pass):

- bf16-stored weights (`dtype=bfloat16` on a CPU without bf16 dot products: AVX2, AVX-512F
  without AVX512-BF16). A decode step reads every weight once, so this halves fp32's bytes
  per token; against oneDNN's bf16 linear, which such a CPU cannot run, and F.linear's
  emulated bf16 (slower than fp32 there), nothing is rounded but the weights: a bf16
  checkpoint computes as fp32 would on its own values. The LM head can therefore be bf16
  too (its logits stay fp32).
- bf16 weights with bf16 dot products ("bf16 pairs", CPUs with AVX512-BF16): x rounded to
  bf16 once per call, products added in fp32, y fp32 (unlike oneDNN's bf16 linear, not
  rounded to bf16): one of the ways a bf16 linear runs there, the LM head's among them.
- fp32 weights: one of the ways an fp32 linear can run, beside oneDNN's and torch's
  (registry.py); `--kernel-choice measure` runs it for the row counts where it is
  the fastest measured (a decode step's few rows, where each weight vector it loads feeds
  every row of a tile).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.model.kernels import library, linear_ops


def pack_weight(weight: torch.Tensor, panel: int, stored: str) -> torch.Tensor:
    """[N, K] -> panels of `panel` columns, N padded with zero columns. "fp32": [N/panel, K,
    panel]; "bf16": [N/panel, K, panel/2, 2], per panel and k word j (two bf16) holding
    column j and column j + panel/2; "bf16 pairs": [N/panel, K/2, panel, 2] (K padded to
    even), per panel and pair of k word j holding column j at k and k + 1."""
    n, k = weight.shape
    padded = F.pad(weight.to(torch.float32 if stored == "fp32" else torch.bfloat16),
                   (0, k % 2 if stored == "bf16 pairs" else 0, 0, -n % panel))
    if stored == "fp32":
        return padded.view(-1, panel, k).transpose(1, 2).contiguous()
    if stored == "bf16":
        return padded.view(-1, 2, panel // 2, k).permute(0, 3, 2, 1).contiguous()
    return padded.view(-1, panel, padded.shape[1] // 2, 2).transpose(1, 2).contiguous()


def reference_linear(x: torch.Tensor, weight: torch.Tensor, stored: str = "bf16") -> torch.Tensor:
    """What the kernel computes before bias and residual, up to the summation order: x
    (rounded to bf16 for "bf16 pairs") times the weights as stored, in fp32."""
    if stored == "fp32":
        return F.linear(x.float(), weight.float())
    x = x.float() if stored == "bf16" else x.bfloat16().float()
    return F.linear(x, weight.bfloat16().float())


class PanelLinear:
    """y = x @ weight.T + bias (+ residual), weight stored as `stored` ("bf16", "fp32": fp32
    arithmetic; "bf16 pairs": bf16 dot products, x rounded to bf16). x: [T, in_features]
    fp32, 2-D; y fp32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 stored: str = "bf16") -> None:
        self.out_features, self.in_features = weight.shape
        self.stored = stored
        self.packed = pack_weight(weight, library.panel_width(), stored)
        self.bias = None if bias is None else bias.float().contiguous()

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return linear_ops.panel_linear(x, self.packed, self.stored, self.bias, residual,
                                       self.out_features)
