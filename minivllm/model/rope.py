"""Rotary position embeddings, with the scaling variants transformers knows
(llama3, linear, dynamic, yarn, longrope, ...) computed by transformers' own init functions.
A config may give parameters per layer type (Gemma 3: a local base for sliding-window
layers, a global one, maybe scaled, for full-attention layers). With partial_rotary_factor
< 1 (Phi-4-mini) only the first rotary_dim dimensions of each head rotate."""

from __future__ import annotations

import torch
from torch import nn


def _rope_parameters(cfg, layer_type: str | None = None) -> dict:
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    if layer_type is not None:
        params = dict(params[layer_type])
    legacy = getattr(cfg, "rope_scaling", None) or {}
    params = {**legacy, **params}
    params.setdefault("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def rotary_dim(cfg, head_dim: int) -> int:
    params = _rope_parameters(cfg, next(iter(rope_layer_types(cfg) or [None])))
    factor = params.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", None))
    return int(head_dim * (factor or 1.0))


def rope_layer_types(cfg) -> set[str] | None:
    """The layer types that have RoPE parameters of their own, or None (one for all)."""
    params = getattr(cfg, "rope_parameters", None) or {}
    types = set(getattr(cfg, "layer_types", None) or ())
    return types if types and types <= set(params) else None


def _inv_freqs(cfg, params: dict, head_dim: int, layer_type: str | None,
               positions: torch.Tensor) -> tuple[torch.Tensor, float]:
    """[positions, D/2] inverse frequencies, and the cos/sin scaling."""
    rope_type = params["rope_type"]
    if rope_type == "default":
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        inv_freq = 1.0 / (params["rope_theta"] ** exponents)
        return inv_freq.expand(len(positions), -1), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unsupported rope_scaling type {rope_type!r}")
    init = ROPE_INIT_FUNCTIONS[rope_type]
    inv_freq, scaling = init(cfg, torch.device("cpu"), layer_type=layer_type)
    if rope_type == "longrope":
        # transformers switches every position of a sequence to the long factors once it
        # outgrows original_max_position_embeddings; here a position's own place decides
        # (short factors before it, long after), so cached keys never need recomputing.
        original = params["original_max_position_embeddings"]
        long, _ = init(cfg, torch.device("cpu"), seq_len=original + 1, layer_type=layer_type)
        return torch.where(positions[:, None] < original, inv_freq, long), scaling
    return inv_freq.expand(len(positions), -1), scaling


class RotaryEmbedding(nn.Module):
    def __init__(self, cfg, head_dim: int, layer_type: str | None = None) -> None:
        super().__init__()
        params = _rope_parameters(cfg, layer_type)
        positions = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        self.rotary_dim = dim = rotary_dim(cfg, head_dim)
        inv_freq, scaling = _inv_freqs(cfg, params, dim, layer_type, positions)
        freqs = positions[:, None] * inv_freq.float()
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        # rotate_half(x) * sin == x.roll(half) * sin with the first half's sign flipped.
        sin = emb.sin() * scaling
        sin[:, :dim // 2].neg_()
        self.register_buffer("signed_sin", sin, persistent=False)

    @property
    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin of every position, [max_positions, rotary_dim] float32."""
        return self.cos, self.signed_sin

    def at(self, positions: torch.Tensor, dtype: torch.dtype
           ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin at the positions, [T, 1, rotary_dim]."""
        return (self.cos[positions].unsqueeze(1).to(dtype),
                self.signed_sin[positions].unsqueeze(1).to(dtype))


def apply_rope(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x: [T, heads, D] (q and k heads together). Bit-identical to transformers'
    x * cos + rotate_half(x) * sin, on the first rotary_dim dimensions."""
    cos, signed_sin = cos_sin
    dim = cos.shape[-1]
    if dim < x.shape[-1]:  # partial rotary: the rest passes through
        return torch.cat([apply_rope(x[..., :dim], cos_sin), x[..., dim:]], dim=-1)
    return x * cos + x.roll(dim // 2, dims=-1) * signed_sin
