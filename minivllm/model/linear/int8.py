"""W8A8 linear layers (`quantization="int8"`): weights quantized once at load to int8,
symmetric, in [-127, 127], one scale per output channel and group of WGROUP = 32 input
values (llama.cpp's Q8_0 blocks); activations quantized dynamically, symmetric, to int8 in
[-127, 127] with one scale per token and group of GROUP = 32 consecutive input values (the
weights' groups: llama.cpp's Q8_0 x Q8_0). Each group's product runs in int32 and is
accumulated in fp32 with its two scales. Why these scales: on SmolLM2-135M per-token
activation scales cost +4.8% perplexity, per group of 32 +0.5% / -0.0% on two texts (of 16:
+0.3% / +0.1%, but twice the kernel's per-group work), and per-channel weight scales up to
+1.0% (per group of 32: none measurable); docs/quantization.md.

On the CPU with the C kernels built, int8_gemm.c does all of it in one call (quantize the
rows, multiply, scale, add bias and residual), with VNNI where the CPU has it and AVX2's
vpmaddubsw with a sign trick where not. On a CPU with AMX, a batch of linear_ops.AMX_MIN_ROWS rows
or more runs amx_gemm.c instead: the same int8 weights unpacked to bf16 tiles (q * scale),
x in bf16 rather than int8, products on AMX-BF16 (reference_amx_linear). Elsewhere the torch reference below runs: the same
quantization, each group's integer product computed in fp32 (exact: 32 * 127 * 127 < 2^24),
accumulated group by group.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.model.kernels import library, linear_ops

_NC, _KP = 16, 32  # int8_gemm.c's panel width and what K is padded to a multiple of
GROUP = 32  # activation values per scale (int8_gemm.c's GROUP)
WGROUP = 32  # weight values per scale (int8_gemm.c's WGROUP)
WEIGHT_MAX = 127  # the weights' range, [-127, 127]
WEIGHT_OFFSET = 128  # packed as q + 128, unsigned (VNNI's unsigned operand)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (int8 [N, K] in [-127, 127], fp32 scales [N, Kp / WGROUP]), Kp = K
    padded to a multiple of 32: w ~ q * scale of its group (1 for an all-zero group)."""
    weight = weight.float()
    n, k = weight.shape
    groups = F.pad(weight, (0, -k % _KP)).view(n, -1, WGROUP)
    amax = groups.abs().amax(dim=2, keepdim=True)
    scales = torch.where(amax > 0, amax / WEIGHT_MAX, torch.ones_like(amax))
    q = torch.round(groups / scales).clamp(-WEIGHT_MAX, WEIGHT_MAX).to(torch.int8)
    return q.view(n, -1)[:, :k].contiguous(), scales.view(n, -1)


def quantize_per_group(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (int8 [T, Kp], fp32 scales [T, Kp / GROUP]) with K zero-padded to Kp, a
    multiple of 32: each group of GROUP values its own symmetric scale (1 for an all-zero
    group). The same fp32 operations as the kernel's."""
    x = x.float()
    rows, k = x.shape
    groups = F.pad(x, (0, -k % _KP)).view(rows, -1, GROUP)
    amax = groups.abs().amax(dim=2, keepdim=True)
    # Divisions by a full tensor: a Python number on either side of `/` makes torch multiply
    # by a reciprocal, rounded differently from C's division (and a tie then rounds the
    # other way).
    full = torch.full_like(amax, 127.0)
    inv = torch.where(amax > 0, full / amax, torch.zeros_like(amax))
    scales = torch.where(amax > 0, amax / full, torch.ones_like(amax))
    return torch.round(groups * inv).to(torch.int8).view(rows, -1), scales.view(rows, -1)


def pack_weight(q: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] -> int8_gemm.c's panel layout: uint8 [N/16, K/4, 16, 4] holding q + 128,
    padded with q = 0 (x is zero there, and padded columns are never written)."""
    n, k = q.shape
    np_, kp = -(-n // _NC) * _NC, -(-k // _KP) * _KP
    padded = (F.pad(q, (0, kp - k, 0, np_ - n)).to(torch.int16) + WEIGHT_OFFSET).to(torch.uint8)
    return padded.view(np_ // _NC, _NC, kp // 4, 4).transpose(1, 2).contiguous()


def pack_scales(scales: torch.Tensor) -> torch.Tensor:
    """fp32 [N, Kp / WGROUP] -> int8_gemm.c's layout: [N/16, Kp / WGROUP, 16], padded
    columns' scales 0."""
    n, groups = scales.shape
    padded = F.pad(scales, (0, 0, 0, -n % _NC))
    return padded.view(-1, _NC, groups).transpose(1, 2).contiguous()


def reference_int8_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor
                          ) -> torch.Tensor:
    """x [T, K] fp32 times int8 weights q [N, K] with their group scales [N, Kp / WGROUP] as
    the kernel computes it, before bias and residual."""
    xq, x_scales = quantize_per_group(x)
    wq = F.pad(q, (0, xq.shape[1] - q.shape[1])).float()
    acc = torch.zeros(x.shape[0], q.shape[0])
    for g in range(x_scales.shape[1]):
        part = slice(g * GROUP, (g + 1) * GROUP)
        acc += F.linear(xq[:, part].float(), wq[:, part]) * (
            x_scales[:, g:g + 1] * scales[:, g * GROUP // WGROUP])
    return acc


def reference_amx_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor
                         ) -> torch.Tensor:
    """What amx_gemm.c computes from linear_ops.AMX_MIN_ROWS rows on a CPU with AMX, before bias and
    residual: the same int8 weights times their group scales, each rounded to bf16, times x
    rounded to bf16, accumulated in fp32 (each product of two bf16 values is exact in fp32)."""
    k = q.shape[1]
    w = q.float() * scales.repeat_interleave(WGROUP, dim=1)[:, :k]
    return F.linear(x.float().bfloat16().float(), w.bfloat16().float())


class Int8Linear:
    """y = x @ weight.T + bias (+ residual), W8A8. x: [T, in_features] fp32, 2-D."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 use_kernel: bool = True) -> None:
        self.out_features = weight.shape[0]
        self.qweight, self.scales = quantize_weight(weight)
        self.bias = None if bias is None else bias.float()
        self.use_kernel = use_kernel and library.available(weight.device, torch.float32)
        if self.use_kernel:
            self.packed, self.packed_scales = pack_weight(self.qweight), pack_scales(self.scales)
            del self.qweight, self.scales  # only the packed copies are read

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.use_kernel:
            return linear_ops.int8_linear(x, self.packed, self.packed_scales, self.bias, residual,
                                          self.out_features, GROUP)
        y = reference_int8_linear(x, self.qweight, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y if residual is None else residual + y
