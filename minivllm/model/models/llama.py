"""Llama-family decoder (Llama, Mistral, Qwen2) over a flattened batch with a paged KV cache.

The layout follows Hugging Face's weights; q/k/v and gate/up are fused at load time so a
layer runs two matmuls fewer, and the residual adds ride on the o / down projections.
On the CPU in fp32 the small per-token ops (RMSNorm, RoPE + KV write, SiLU-and-mul) run
as fused C kernels; everywhere else, and with fast=False, they are the plain torch ops.
With quantization="int8" every linear, the LM head included, is W8A8
(kernels/linear_int8.py); embeddings, norms and attention stay in float32 (README,
"Quantization": the LM head in int8 costs little accuracy and a fifth of the weight bytes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.model import kernels
from minivllm.model.attention import AttentionMetadata, paged_attention, write_kv
from minivllm.model.kernels import cpu
from minivllm.model.kernels.linear import Linear
from minivllm.model.kernels.linear_int8 import Int8Linear
from minivllm.model.rope import RotaryEmbedding, apply_rope


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float, fused: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return cpu.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None, fast: bool,
            int8: bool) -> Linear | Int8Linear:
    return Int8Linear(weight, bias, use_kernel=fast) if int8 else Linear(weight, bias, fast)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, weights: dict[str, torch.Tensor], prefix: str, fast: bool,
                 fused: bool, int8: bool) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = self.head_dim ** -0.5
        self.fused = fused
        w = lambda name: weights.pop(prefix + name)  # noqa: E731
        maybe = lambda name: weights.pop(prefix + name, None)  # noqa: E731
        attn = "self_attn."
        biases = [maybe(attn + f"{p}_proj.bias") for p in "qkv"]
        self.qkv = _linear(torch.cat([w(attn + f"{p}_proj.weight") for p in "qkv"]),
                           torch.cat(biases) if biases[0] is not None else None, fast, int8)
        self.o_proj = _linear(w(attn + "o_proj.weight"), maybe(attn + "o_proj.bias"), fast,
                              int8)
        self.gate_up = _linear(torch.cat([w("mlp.gate_proj.weight"),
                                          w("mlp.up_proj.weight")]), None, fast, int8)
        self.down = _linear(w("mlp.down_proj.weight"), None, fast, int8)
        self.input_norm = RMSNorm(w("input_layernorm.weight"), cfg.rms_norm_eps, fused)
        self.post_attn_norm = RMSNorm(w("post_attention_layernorm.weight"), cfg.rms_norm_eps,
                                      fused)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim

    def _queries(self, qkv: torch.Tensor, positions: torch.Tensor,
                 rope: tuple[torch.Tensor, torch.Tensor], k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Rotary-embedded queries [T, H, D]; the new keys and values go to the cache.
        rope: (cos, signed sin), whole tables when fused, else already at the positions."""
        if self.fused:
            cpu.rope_write_kv(qkv, positions, rope, meta.slot_mapping, k_cache, v_cache,
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
        qkv = self.qkv(self.input_norm(x))
        q = self._queries(qkv, positions, rope, k_cache, v_cache, meta)
        x = self.o_proj(paged_attention(q, k_cache, v_cache, meta, self.scale).flatten(1),
                        residual=x)
        gate_up = self.gate_up(self.post_attn_norm(x))
        if self.fused:
            act = cpu.silu_and_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate) * up
        return self.down(act, residual=x)


class LlamaForCausalLM(nn.Module):
    """Also serves MistralForCausalLM and Qwen2ForCausalLM (q/k/v bias comes with the weights)."""

    def __init__(self, cfg, weights: dict[str, torch.Tensor], fast: bool | None = None,
                 quantization: str | None = None) -> None:
        """fast=False keeps every op on plain torch (the reference for tests). Weights must
        already be on the target device: oneDNN reorders them here, int8 quantizes them."""
        super().__init__()
        fast = kernels.enabled() if fast is None else fast
        self.embed = nn.Parameter(weights.pop("model.embed_tokens.weight"), requires_grad=False)
        self.fused = fast and cpu.available(self.embed.device, self.embed.dtype)
        int8 = quantization == "int8"
        self.layers = nn.ModuleList(DecoderLayer(cfg, weights, f"model.layers.{i}.", fast,
                                                 self.fused, int8)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(weights.pop("model.norm.weight"), cfg.rms_norm_eps, self.fused)
        lm_head = weights.pop("lm_head.weight", None)
        if lm_head is None or getattr(cfg, "tie_word_embeddings", False):
            lm_head = self.embed
        self.lm_head = _linear(lm_head, None, fast, int8)
        self.rope = RotaryEmbedding(cfg, cfg.head_dim)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
                ) -> torch.Tensor:
        """Hidden states [T, hidden] of the flattened batch; K/V written to the caches
        (k_caches / v_caches: [num_layers, num_blocks, block_size, num_kv_heads, head_dim])."""
        k_caches, v_caches = kv_caches
        x = F.embedding(input_ids, self.embed)
        rope = self.rope.tables if self.fused else self.rope.at(positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, rope, k_caches[i], v_caches[i], meta)
        return self.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
