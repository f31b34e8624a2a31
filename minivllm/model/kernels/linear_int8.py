"""W8A8 linear layers (`quantization="int8"`): weights quantized once at load to int8,
symmetric, one scale per output channel, in [-63, 63]; activations quantized per token,
dynamically, symmetric, to int8 in [-127, 127]. The product runs in int32 and is scaled
back to fp32. The weights leave their eighth bit to the kernel: stored offset by 64, they
are the unsigned operand of AVX2's int8 multiply without saturating it (int8_gemm.c).

On the CPU with the C kernels built, int8_gemm.c does all of it in one call (quantize the
rows, multiply, scale, add bias and residual). This CPU has AVX2 but neither VNNI nor
AMX, and torch's int8 GEMMs were no help here (measured by benchmarks/int8_gemm.py):
oneDNN's and fbgemm's u8 x s8 kernels saturate in int16 without VNNI on 8-bit weights
(outputs 4-13% off; fbgemm's does not on these 7-bit ones, but it quantizes activations per
tensor, not per token, and torch deprecates it), and torch._int_mm and _weight_int8pack_mm
run reference loops (20-170x slower than the fp32 linear at 64 rows). Elsewhere the torch reference below
runs: the same quantization, the integer product computed in fp32 (exact while K * 127 * 63
stays below 2^24, i.e. K <= 2096; within fp32 rounding beyond).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.model.kernels import cpu

_NR, _CHUNK = 4, 32  # int8_gemm.c's panel width and K chunk
WEIGHT_MAX = 63  # the weights' range, [-63, 63]; packed as q + WEIGHT_OFFSET, in [1, 127]
WEIGHT_OFFSET = 64


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (int8 [N, K] in [-63, 63], fp32 scales [N]); w ~ q * scale."""
    weight = weight.float()
    amax = weight.abs().amax(dim=1)
    scales = torch.where(amax > 0, amax / WEIGHT_MAX, torch.ones_like(amax))
    q = torch.round(weight / scales[:, None]).clamp(-WEIGHT_MAX, WEIGHT_MAX).to(torch.int8)
    return q, scales


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (int8 [T, K], fp32 scales [T]), the same fp32 operations as the kernel's."""
    x = x.float()
    amax = x.abs().amax(dim=1)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    scales = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return torch.round(x * inv[:, None]).to(torch.int8), scales


def pack_weight(q: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] -> int8_gemm.c's panel layout: uint8 [N/4, K/32, 4, 32] holding
    q + 64, padded (with 0: x is zero there, and padded columns are never written)."""
    n, k = q.shape
    np_, kp = -(-n // _NR) * _NR, -(-k // _CHUNK) * _CHUNK
    padded = F.pad(q.to(torch.uint8) + WEIGHT_OFFSET, (0, kp - k, 0, np_ - n))
    return padded.view(np_ // _NR, _NR, kp // _CHUNK, _CHUNK).transpose(1, 2).contiguous()


class Int8Linear:
    """y = x @ weight.T + bias (+ residual), W8A8. x: [T, in_features] fp32, 2-D."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 use_kernel: bool = True) -> None:
        self.out_features = weight.shape[0]
        self.qweight, self.scales = quantize_per_channel(weight)
        self.bias = None if bias is None else bias.float()
        self.use_kernel = use_kernel and cpu.available(weight.device, torch.float32)
        if self.use_kernel:
            self.packed = pack_weight(self.qweight)
            del self.qweight  # only the packed copy is read

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.use_kernel:
            return cpu.int8_linear(x, self.packed, self.scales, self.bias, residual,
                                   self.out_features)
        q, x_scales = quantize_per_token(x)
        y = F.linear(q.float(), self.qweight.float()) * (x_scales[:, None] * self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y if residual is None else residual + y
