"""Rotary position embeddings, with the scaling variants transformers knows
(llama3, linear, dynamic, yarn, ...) computed by transformers' own init functions."""

from __future__ import annotations

import torch
from torch import nn


def _rope_parameters(cfg) -> dict:
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    legacy = getattr(cfg, "rope_scaling", None) or {}
    params = {**legacy, **params}
    params.setdefault("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    return params


class RotaryEmbedding(nn.Module):
    def __init__(self, cfg, head_dim: int) -> None:
        super().__init__()
        params = _rope_parameters(cfg)
        rope_type = params["rope_type"]
        if rope_type == "default":
            exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
            inv_freq, scaling = 1.0 / (params["rope_theta"] ** exponents), 1.0
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            if rope_type not in ROPE_INIT_FUNCTIONS:
                raise ValueError(f"unsupported rope_scaling type {rope_type!r}")
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](cfg, torch.device("cpu"))
        positions = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq.float())
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        # rotate_half(x) * sin == x.roll(half) * sin with the first half's sign flipped.
        sin = emb.sin() * scaling
        sin[:, :head_dim // 2].neg_()
        self.register_buffer("signed_sin", sin, persistent=False)

    @property
    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin of every position, [max_positions, D] float32."""
        return self.cos, self.signed_sin

    def at(self, positions: torch.Tensor, dtype: torch.dtype
           ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin at the positions, [T, 1, D]."""
        return (self.cos[positions].unsqueeze(1).to(dtype),
                self.signed_sin[positions].unsqueeze(1).to(dtype))


def apply_rope(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x: [T, heads, D] (q and k heads together). Bit-identical to transformers'
    x * cos + rotate_half(x) * sin."""
    cos, signed_sin = cos_sin
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin
