"""lora_sgmv.c behind a torch-facing wrapper: the LoRA adapters' low-rank products, each
request's rows through its own adapter, added into a linear's output in place."""

from __future__ import annotations

import torch

from minivllm.model.kernels import library


def lora_sgmv(x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, seg: torch.Tensor,
              a: torch.Tensor, b: torch.Tensor, bounds: torch.Tensor) -> None:
    """y[rows[i]] += (x[rows[i]] @ a[s].T) @ B[s] in place, for each row i of segment s
    (rows[seg[s]:seg[s + 1]]): lora_sgmv.c. x [T, k] and y [T, n] fp32 with dense rows (any
    row stride); a [S, r, k] and b [S, r / slots, n] contiguous, both fp32 or both bf16: B[s]
    is block-diagonal, slot t's ranks (r / slots of them) feeding its columns bounds[t] to
    bounds[t + 1] (int64, slots + 1 of them, the last n), and b[s] holds its blocks side by
    side. rows and seg int64."""
    x = x if x.stride(1) == 1 else x.contiguous()
    h = torch.empty(rows.shape[0], a.shape[1])
    lib = library._library()
    kernel = lib.lora_sgmv_bf16w if a.dtype == torch.bfloat16 else lib.lora_sgmv_f32
    kernel(x=x.data_ptr(), ldx=x.stride(0), y=y.data_ptr(), ldy=y.stride(0),
           rows=rows.data_ptr(), seg=seg.data_ptr(), segments=a.shape[0], a=a.data_ptr(),
           b=b.data_ptr(), bounds=bounds.data_ptr(), slots=bounds.shape[0] - 1,
           h=h.data_ptr(), k=a.shape[2], r=a.shape[1], n=b.shape[2],
           num_threads=torch.get_num_threads())
