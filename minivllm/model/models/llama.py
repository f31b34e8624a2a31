"""Llama-family decoder (Llama, Mistral, Qwen2) over a flattened batch with a paged KV cache.

The layout follows Hugging Face's weights; q/k/v and gate/up are fused at load time so a
layer runs two matmuls fewer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.model.attention import AttentionMetadata, paged_attention, write_kv
from minivllm.model.rope import RotaryEmbedding


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, weights: dict[str, torch.Tensor], prefix: str) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = self.head_dim ** -0.5
        w = lambda name: weights.pop(prefix + name)  # noqa: E731
        maybe = lambda name: weights.pop(prefix + name, None)  # noqa: E731
        attn = "self_attn."
        self.qkv_weight = nn.Parameter(torch.cat(
            [w(attn + "q_proj.weight"), w(attn + "k_proj.weight"), w(attn + "v_proj.weight")]),
            requires_grad=False)
        biases = [maybe(attn + f"{p}_proj.bias") for p in "qkv"]
        self.qkv_bias = (nn.Parameter(torch.cat(biases), requires_grad=False)
                         if biases[0] is not None else None)
        self.o_weight = nn.Parameter(w(attn + "o_proj.weight"), requires_grad=False)
        self.o_bias = maybe(attn + "o_proj.bias")
        self.gate_up_weight = nn.Parameter(
            torch.cat([w("mlp.gate_proj.weight"), w("mlp.up_proj.weight")]), requires_grad=False)
        self.down_weight = nn.Parameter(w("mlp.down_proj.weight"), requires_grad=False)
        self.input_norm = RMSNorm(w("input_layernorm.weight"), cfg.rms_norm_eps)
        self.post_attn_norm = RMSNorm(w("post_attention_layernorm.weight"), cfg.rms_norm_eps)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding, positions: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
                ) -> torch.Tensor:
        h = self.input_norm(x)
        qkv = F.linear(h, self.qkv_weight, self.qkv_bias)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q, k = rope(positions, q, k)
        write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        attn = paged_attention(q, k_cache, v_cache, meta, self.scale)
        x = x + F.linear(attn.flatten(1), self.o_weight, self.o_bias)
        h = self.post_attn_norm(x)
        gate, up = F.linear(h, self.gate_up_weight).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.down_weight)


class LlamaForCausalLM(nn.Module):
    """Also serves MistralForCausalLM and Qwen2ForCausalLM (q/k/v bias comes with the weights)."""

    def __init__(self, cfg, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.embed = nn.Parameter(weights.pop("model.embed_tokens.weight"), requires_grad=False)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, weights, f"model.layers.{i}.") for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(weights.pop("model.norm.weight"), cfg.rms_norm_eps)
        lm_head = weights.pop("lm_head.weight", None)
        if lm_head is None or getattr(cfg, "tie_word_embeddings", False):
            lm_head = self.embed
        self.lm_head = lm_head
        self.rope = RotaryEmbedding(cfg, cfg.head_dim)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
                ) -> torch.Tensor:
        """Hidden states [T, hidden] of the flattened batch; K/V written to the caches
        (k_caches / v_caches: [num_layers, num_blocks, block_size, num_kv_heads, head_dim])."""
        k_caches, v_caches = kv_caches
        x = F.embedding(input_ids, self.embed)
        for i, layer in enumerate(self.layers):
            x = layer(x, self.rope, positions, k_caches[i], v_caches[i], meta)
        return self.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.lm_head).float()
