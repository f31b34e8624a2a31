"""The dense linears' kernels behind torch-facing wrappers (the linears that run them:
model/linear/): W8A8 int8 (int8_gemm.c), bf16 on AMX tiles (amx_gemm.c) and fp32 or bf16
weights in panels (panel_gemm.c); and LinearOperands, what they (and gguf_ops.py's) take
around their weights. fp32 activations in and out."""

from __future__ import annotations

import torch

from minivllm.model.kernels import library


class LinearOperands:
    """What every linear kernel takes around its weights: x [T, K] and residual [T, N] with
    unit column stride (copied if not; rows may be strided), a fresh fp32 y [T, N], and
    their arguments (`args`). Holding it keeps any copy alive through the call."""

    def __init__(self, x: torch.Tensor, bias: torch.Tensor | None,
                 residual: torch.Tensor | None, out_features: int) -> None:
        self.x = x if x.stride(1) == 1 else x.contiguous()
        self.residual = (residual.contiguous() if residual is not None
                         and residual.stride(1) != 1 else residual)
        self.rows, self.k = self.x.shape
        self.y = torch.empty(self.rows, out_features, dtype=torch.float32)
        self.args = dict(
            x=self.x.data_ptr(), ldx=self.x.stride(0),
            bias=None if bias is None else bias.data_ptr(),
            residual=None if self.residual is None else self.residual.data_ptr(),
            ldr=0 if self.residual is None else self.residual.stride(0), y=self.y.data_ptr(),
            rows=self.rows, k=self.k, n=out_features, num_threads=torch.get_num_threads())


AMX_MIN_ROWS = 32  # from here on a batch is worth unpacking the weights to bf16 tiles for


def int8_linear(x: torch.Tensor, packed: torch.Tensor, w_scales: torch.Tensor,
                bias: torch.Tensor | None, residual: torch.Tensor | None,
                out_features: int, group: int) -> torch.Tensor:
    """W8A8: x [T, K] fp32 (rows may be strided) quantized inside the call, per row and group
    of `group` values, times int8 weights and their group scales packed by
    linear/int8.py's pack_weight, scaled back to fp32 [T, out_features]; bias [N] and residual
    [T, N] (fp32) added in the same pass. See int8_gemm.c. From AMX_MIN_ROWS rows on a CPU
    with AMX, the same weights on AMX-BF16 tiles with x in bf16 instead (amx_gemm.c)."""
    ops = LinearOperands(x, bias, residual, out_features)
    rows, kp = ops.rows, -(-ops.k // 32) * 32
    common = dict(**ops.args, w=packed.data_ptr(), w_scales=w_scales.data_ptr(), kp=kp)
    lib = library._library()
    if rows >= AMX_MIN_ROWS and library.amx() and lib.int8_linear_amx_f32(**common) == 0:
        return ops.y
    scratch = torch.empty(rows * kp, dtype=torch.int8)
    gscales = torch.empty(rows * (kp // group), dtype=torch.float32)
    gsums = torch.empty(rows * (kp // group), dtype=torch.int32)
    lib.int8_linear_f32(**common, scratch=scratch.data_ptr(), gscales=gscales.data_ptr(),
                        gsums=gsums.data_ptr())
    return ops.y


def bf16_linear_amx(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                    residual: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [T, K] fp32 (rows may be strided) times bf16 weights packed by linear/amx.py's
    pack_weight, on AMX-BF16 tiles -> fp32 [T, out_features]; bias [N] and residual [T, N]
    (fp32) added in the same pass. See amx_gemm.c; only where library.amx()."""
    ops = LinearOperands(x, bias, residual, out_features)
    status = library._library().bf16_linear_amx_f32(**ops.args, w=packed.data_ptr(),
                                                     kp=packed.shape[1] * 2)
    if status != 0:
        raise RuntimeError("bf16_linear_amx: the AMX tiles could not be used (Linux refused "
                           "them, or memory ran out)")
    return ops.y


# kernels.h's PANEL_STORED_* codes: fp32 and bf16 weights (fp32 arithmetic), bf16 pairs (bf16
# dot products)
PANEL_STORED = {"fp32": 0, "bf16": 1, "bf16 pairs": 2}


def panel_linear(x: torch.Tensor, packed: torch.Tensor, stored: str, bias: torch.Tensor | None,
                 residual: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [T, K] fp32 (rows may be strided) times weights packed by linear/panels.py's
    pack_weight as `stored` (PANEL_STORED's names) -> fp32 [T, out_features]; bias [N] and
    residual [T, N] (fp32) added in the same pass. See panel_gemm.c; only where
    library.panel_width() (and for "bf16 pairs" library.panel_bf16_dot())."""
    ops = LinearOperands(x, bias, residual, out_features)
    status = library._library().panel_linear_f32(**ops.args, w=packed.data_ptr(),
                                                  stored=PANEL_STORED[stored])
    if status == -2:
        raise MemoryError("panel_linear: no memory for x in bf16")
    if status != 0:
        raise RuntimeError(f"panel_linear: this library has no panel kernel for {stored} "
                           "weights")
    return ops.y
