"""bf16 linear layers on AMX tiles (`dtype=bfloat16` on a CPU with AMX-BF16): the weights are
rounded to bf16 and packed once at load into amx_gemm.c's B-tile layout, x is rounded to
bf16 inside the call, products accumulate in fp32 and y comes back in fp32, bias and
residual added in the same pass.

Against oneDNN's bf16 linear (onednn.py), which the CPU's bf16 runs elsewhere: no fp32 <->
bf16 conversions around the call, and the output is not rounded to bf16, so the LM head
can be bf16 too (oneDNN's bf16 logits tied SmolLM2's top two tokens, and the LM head stays
fp32 there: 4 bytes a weight read at every step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.model.kernels import linear_ops

_NC, _KP = 16, 32  # amx_gemm.c's panel width and what K is padded to a multiple of


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] -> bf16 [N/16 panels, K/2 pairs, 16 columns, 2] (padded with zeros): per panel,
    one B-tile row per pair of k holding the 16 columns' two values."""
    n, k = weight.shape
    padded = F.pad(weight.to(torch.bfloat16), (0, -k % _KP, 0, -n % _NC))
    np_, kp = padded.shape
    return padded.view(np_ // _NC, _NC, kp // 2, 2).transpose(1, 2).contiguous()


def reference_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What the kernel computes before bias and residual: bf16 x times bf16 weights, exact
    products accumulated in fp32."""
    return F.linear(x.float().bfloat16().float(), weight.bfloat16().float())


class AmxBf16Linear:
    """y = x @ weight.T + bias (+ residual), weight in bf16. x: [T, in_features] fp32, 2-D;
    y fp32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self.packed = pack_weight(weight)
        self.bias = None if bias is None else bias.float()

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return linear_ops.bf16_linear_amx(x, self.packed, self.bias, residual, self.out_features)
