"""The parts every decoder here is built from: RMSNorm, the attention block over the paged
KV cache and the gated MLP (their linears built by model/linear/registry.py). On the CPU in
fp32 the small per-token ops (RMSNorm, RoPE + KV write, SiLU-and-mul) run as fused C
kernels; everywhere else, and with fast=False, they are the plain torch ops."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.model.attention import AttentionMetadata, paged_attention, write_kv
from minivllm.model.kernels import attention_ops, fused_ops
from minivllm.model.linear.gguf import GGUFLinear
from minivllm.model.linear.registry import AnyLinear
from minivllm.model.rope import apply_rope

# hidden_act / hidden_activation -> the function (transformers' names)
ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


class RMSNorm(nn.Module):
    """x / rms(x) * weight. Gemma's (1 + weight) form is the same with 1 added at load."""

    def __init__(self, weight: torch.Tensor, eps: float, fused: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return fused_ops.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    """q/k/v (one fused matmul), optional per-head RMSNorm on q and k before RoPE (Qwen3,
    Gemma 3), K/V to the cache, paged attention with the layer's window and softcap.
    qk_scale (an int8 KV cache's key smoothing, key_smoothing.py): the factors q and k
    are multiplied by before RoPE. Returns the heads' outputs [T, H * D], before o_proj."""

    def __init__(self, cfg, qkv: AnyLinear, q_norm: RMSNorm | None,
                 k_norm: RMSNorm | None, scale: float, window: int, softcap: float,
                 fused: bool, qk_scale: torch.Tensor | None = None) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv, self.q_norm, self.k_norm = qkv, q_norm, k_norm
        self.scale, self.window, self.softcap = scale, window, softcap
        self.fused = fused  # the C RoPE + KV write
        self.register_buffer("qk_scale", qk_scale, persistent=False)

    def _normed(self, qkv: torch.Tensor) -> torch.Tensor:
        """qkv with q and k normalized per head, one contiguous [T, (H + 2 KVH) * D]."""
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
        k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
        return torch.cat([q, k, v], dim=-1)

    def _queries(self, qkv: torch.Tensor, positions: torch.Tensor,
                 rope: tuple[torch.Tensor, torch.Tensor], k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Rotary-embedded queries [T, H, D]; the new keys and values go to the cache.
        rope: (cos, signed sin), whole tables when fused, else already at the positions."""
        if self.fused:
            attention_ops.rope_write_kv(qkv, positions, rope, meta.slot_mapping, k_cache, v_cache,
                                        self.num_heads, self.num_kv_heads, self.head_dim)
            return qkv[:, :self.q_size].view(-1, self.num_heads, self.head_dim)
        qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        qk = apply_rope(qk.view(-1, self.num_heads + self.num_kv_heads, self.head_dim), rope)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        write_kv(k_cache, v_cache, k, v.view(-1, self.num_kv_heads, self.head_dim),
                 meta.slot_mapping)
        return q

    def forward(self, x: torch.Tensor, positions: torch.Tensor,
                rope: tuple[torch.Tensor, torch.Tensor], k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv(x)
        if self.q_norm is not None:
            qkv = self._normed(qkv)
        if self.qk_scale is not None:
            qkv[:, :self.q_size + self.kv_size].mul_(self.qk_scale)
        q = self._queries(qkv, positions, rope, k_cache, v_cache, meta)
        return paged_attention(q, k_cache, v_cache, meta, self.scale, self.window,
                               self.softcap).flatten(1)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), gate and up as one matmul; the residual add rides on down."""

    def __init__(self, gate_up: AnyLinear, down: AnyLinear,
                 activation: str, fused: bool) -> None:
        super().__init__()
        self.gate_up, self.down = gate_up, down
        self.act = ACTIVATIONS[activation]
        self.fused_silu = fused and activation == "silu"

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        """act(gate(x)) * up(x): what down reads."""
        if self.fused_silu and isinstance(self.gate_up, GGUFLinear):
            return self.gate_up.silu_and_mul(x)  # in the kernel's epilogue where it can
        if self.fused_silu:
            return fused_ops.silu_and_mul(self.gate_up(x))
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.act(gate) * up

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return self.down(self.activation(x), residual=residual)
