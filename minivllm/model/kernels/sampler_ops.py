"""The sampler's kernels behind torch-facing wrappers: greedy argmax (ops.c), and
sampler.c's fused penalties, filters and draw, with the uniforms its draw takes. The torch
path of model/sampler.py is the reference."""

from __future__ import annotations

import torch

from minivllm.model.kernels import library


def argmax(x: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax of x [N, V] (contiguous), first index on ties -> [N] int64."""
    out = torch.empty(x.shape[0], dtype=torch.long)
    library._library().argmax_rows_f32(x=x.data_ptr(), out=out.data_ptr(), rows=x.shape[0],
                                       cols=x.shape[1], num_threads=torch.get_num_threads())
    return out


def sample_rows(logits: torch.Tensor, fparams: torch.Tensor, iparams: torch.Tensor,
                seen: tuple, penalties: tuple, bans: tuple) -> torch.Tensor:
    """One token per row of logits [N, V] (contiguous fp32): see sampler.c's sample_rows_f32
    and minivllm/model/sampler.py. seen = (offsets, ids), penalties = (offsets, ids, deltas),
    bans = (offsets, ids): numpy arrays (int64 offsets, int32 ids, fp32 deltas). The logits
    are penalized in place during the call and restored, value for value."""
    out = torch.empty(logits.shape[0], dtype=torch.long)
    (seen_off, seen_ids), (pen_off, pen_ids, pen_deltas), (ban_off, ban_ids) = (
        seen, penalties, bans)
    library._library().sample_rows_f32(
        logits=logits.data_ptr(), rows=logits.shape[0], vocab=logits.shape[1],
        fparams=fparams.data_ptr(), iparams=iparams.data_ptr(),
        seen_off=seen_off.ctypes.data, seen_ids=seen_ids.ctypes.data,
        pen_off=pen_off.ctypes.data, pen_ids=pen_ids.ctypes.data,
        pen_deltas=pen_deltas.ctypes.data, ban_off=ban_off.ctypes.data,
        ban_ids=ban_ids.ctypes.data, out=out.data_ptr(), num_threads=torch.get_num_threads())
    return out


def sampler_uniforms(keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The sampler's uniform for each (key, position), both int64 [N] -> float64 [N]."""
    out = torch.empty(keys.shape[0], dtype=torch.float64)
    library._library().sampler_uniforms_f64(
        keys=keys.data_ptr(), positions=positions.data_ptr(), out=out.data_ptr(),
        n=keys.shape[0])
    return out
