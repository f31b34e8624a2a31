"""Linear layers that run through oneDNN on the CPU.

PyTorch's fp32 `F.linear` calls MKL, which on this AMD CPU reaches about half the speed
of oneDNN's JIT kernels (measured in docs/performance.md). oneDNN also wants its weights
reordered once into its blocked layout; the residual add can ride along as a post-op.
oneDNN compiles and keeps a kernel per row count, so row counts are rounded up to a few
buckets (padding rows): without that, memory grew with every new batch size a server saw.
Anywhere else (CUDA, float16, a torch without mkldnn) this is plain `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.core.step_batch import padded_rows

# The batch size oneDNN's weight layout is chosen for; measured as good from 1 to 2048 rows.
_PACK_BATCH = 64


def onednn_usable(weight: torch.Tensor) -> bool:
    # oneDNN's packed bf16 weights need avx512_bf16-class hardware (or AVX-NE-CONVERT);
    # elsewhere reordering them fails, so bf16 takes F.linear.
    bf16 = weight.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return (weight.device.type == "cpu" and (weight.dtype == torch.float32 or bf16)
            and torch.backends.mkldnn.is_available())


class Linear:
    """y = x @ weight.T + bias (+ residual). x: [T, in_features], 2-D.

    bf16 weights with an fp32 x (the CPU's bf16: fp32 between the ops, so the C kernels run
    as in fp32): x is converted to bf16 at the product, which runs in bf16 with fp32
    accumulation (oneDNN's avx512_bf16 kernels), and y comes back in fp32, with the bias
    and the residual added in fp32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 onednn: bool = True) -> None:
        self.bias = bias
        self.onednn = onednn and onednn_usable(weight)
        self.weight = (torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_BATCH)
                       if self.onednn else weight)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if x.dtype == self.weight.dtype:
            return self._product(x, self.bias, residual)
        y = self._product(x.to(self.weight.dtype), None, None).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y if residual is None else residual + y

    def _product(self, x: torch.Tensor, bias: torch.Tensor | None,
                 residual: torch.Tensor | None) -> torch.Tensor:
        if not self.onednn:
            y = F.linear(x, self.weight, bias)
            return y if residual is None else residual + y
        rows = x.shape[0]
        if padded_rows(rows) != rows:  # the runner pads a step's batch once; others here
            pad = (0, 0, 0, padded_rows(rows) - rows)
            residual = None if residual is None else F.pad(residual, pad)
            return self._product(F.pad(x, pad), bias, residual)[:rows]
        if residual is None:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, bias, "none", [], "")
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self.weight, bias, "add")
