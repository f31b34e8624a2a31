"""The decoder every supported architecture is (Llama, Mistral, Qwen2/3, Phi-3, Mixtral,
Qwen3-MoE, Gemma 2/3) over a flattened batch with a paged KV cache.

One layer skeleton; what differs per architecture is data, read from the config and the
checkpoint's names (models/__init__.py checks that nothing else differs):
- q/k/v and gate/up are fused at load (Phi-3 ships them fused), so a layer runs two matmuls
  fewer; q_norm / k_norm in the checkpoint (Qwen3, Gemma 3) normalize each head before RoPE.
- Gemma: (1 + weight) norms (1 added at load), embeddings times sqrt(hidden), a norm after
  attention and after the MLP as well as before, GeGLU, query_pre_attn_scalar, logit caps.
- Sliding-window layers (layer_types / sliding_window) attend to their window only, with
  the RoPE parameters of their layer type (Gemma 3's local base).
- Mixtral / Qwen3-MoE: the MLP is a SparseMoeBlock (moe.py).
With quantization="int8" every linear, the LM head included, is W8A8
(linear/int8.py), experts too; embeddings, norms, routers and attention stay fp32.
With quantization="gguf" the linears whose weights a GGUF file stores as a block type the
kernels run, run from those blocks (linear/gguf.py; q/k/v and gate/up concatenated as
blocks, or one kernel call per part where their types differ); the token embeddings' blocks
are dequantized a looked-up row at a time, and a tied LM head runs from them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.model import key_smoothing
from minivllm.model.attention import AttentionMetadata
from minivllm.model.kernels import library
from minivllm.model.linear.choice import KernelChoice
from minivllm.model.linear.gguf import BlockWeight, cat_rows
from minivllm.model.linear.registry import bf16_logits_stay_fp32, build_linear
from minivllm.model.models.layers import Attention, GatedMLP, RMSNorm
from minivllm.model.models.moe import EXPERT_NAMES, SparseMoeBlock
from minivllm.model.rope import RotaryEmbedding, rope_layer_types, rotary_dim


@dataclass(frozen=True)
class Arch:
    """What an architecture adds to the Llama layer."""

    gemma: bool = False  # (1 + w) norms, scaled embeddings, sandwich norms, GeGLU, logit caps
    attn_softcap: bool = False  # attn_logit_softcapping is applied (Gemma 2; Gemma 3 ignores it)
    experts: str | None = None  # an EXPERT_NAMES key: the MLP is a mixture of experts


def layer_windows(cfg) -> list[int]:
    """Each layer's sliding window (0: full attention). Without layer_types (Mistral,
    Mixtral, Phi-3) transformers applies sliding_window to every layer."""
    window = getattr(cfg, "sliding_window", None) or 0
    types = getattr(cfg, "layer_types", None)
    if types is None:
        return [window] * cfg.num_hidden_layers
    return [window if t == "sliding_attention" else 0 for t in types]


class Weights:
    """Pops one layer's tensors out of the state dict (CausalLM refuses leftovers)."""

    def __init__(self, state: dict[str, torch.Tensor], prefix: str) -> None:
        self.state, self.prefix = state, prefix

    def __call__(self, name: str) -> torch.Tensor:
        return self.state.pop(self.prefix + name)

    def maybe(self, name: str) -> torch.Tensor | None:
        return self.state.pop(self.prefix + name, None)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, arch: Arch, w: Weights, index: int, fast: bool, fused: bool,
                 linear_weights: str | None, smooth_keys: bool = False,
                 kernel_choice: KernelChoice | None = None) -> None:
        super().__init__()
        eps = cfg.rms_norm_eps
        qk_scale = _qk_scales(cfg, arch, w) if smooth_keys else None
        norm = lambda name: RMSNorm(w(name) + 1 if arch.gemma else w(name), eps,  # noqa: E731
                                    fused)
        lin = lambda weight, bias=None: build_linear(  # noqa: E731
            weight, bias, fast, linear_weights, kernel_choice)
        attn = "self_attn."
        if (qkv := w.maybe(attn + "qkv_proj.weight")) is None:  # Phi-3 ships it fused
            qkv = cat_rows([w(attn + f"{p}_proj.weight") for p in "qkv"])
        biases = [w.maybe(attn + f"{p}_proj.bias") for p in "qkv"]
        qkv_bias = torch.cat(biases) if biases[0] is not None else None
        has_qk_norm = w.prefix + attn + "q_norm.weight" in w.state
        scalar = cfg.query_pre_attn_scalar if arch.gemma else cfg.head_dim
        self.self_attn = Attention(
            cfg, lin(qkv, qkv_bias), norm(attn + "q_norm.weight") if has_qk_norm else None,
            norm(attn + "k_norm.weight") if has_qk_norm else None, scalar ** -0.5,
            layer_windows(cfg)[index],
            (cfg.attn_logit_softcapping or 0.0) if arch.attn_softcap else 0.0,
            fused and _whole_head_rope(cfg), qk_scale)
        self.o_proj = lin(w(attn + "o_proj.weight"), w.maybe(attn + "o_proj.bias"))
        self.input_norm = norm("input_layernorm.weight")
        # Llama: post_attention_layernorm is the MLP's input norm. Gemma: it normalizes the
        # attention output, and pre/post_feedforward_layernorm wrap the MLP.
        if arch.gemma:
            self.post_attn_norm = norm("post_attention_layernorm.weight")
            self.pre_mlp_norm = norm("pre_feedforward_layernorm.weight")
            self.post_mlp_norm = norm("post_feedforward_layernorm.weight")
        else:
            self.post_attn_norm, self.post_mlp_norm = None, None
            self.pre_mlp_norm = norm("post_attention_layernorm.weight")
        self.mlp = _mlp(cfg, arch, w, index, lin, fused)

    def forward(self, x: torch.Tensor, positions: torch.Tensor,
                rope: tuple[torch.Tensor, torch.Tensor], k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        attn = self.self_attn(self.input_norm(x), positions, rope, k_cache, v_cache, meta)
        if self.post_attn_norm is None:
            x = self.o_proj(attn, residual=x)
            return self.mlp(self.pre_mlp_norm(x), residual=x)
        x = x + self.post_attn_norm(self.o_proj(attn))
        return x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x)))


def _mlp(cfg, arch: Arch, w: Weights, index: int, lin, fused: bool
         ) -> GatedMLP | SparseMoeBlock:
    activation = getattr(cfg, "hidden_activation", None) or cfg.hidden_act
    if arch.experts and _is_sparse(cfg, index):
        moe, gate, up, down = EXPERT_NAMES[arch.experts]
        experts = [GatedMLP(lin(cat_rows([w(f"{moe}experts.{e}.{gate}.weight"),
                                          w(f"{moe}experts.{e}.{up}.weight")])),
                            lin(w(f"{moe}experts.{e}.{down}.weight")), activation, fused)
                   for e in range(_num_experts(cfg))]
        return SparseMoeBlock(w(moe + "gate.weight"), experts, cfg.num_experts_per_tok,
                              getattr(cfg, "norm_topk_prob", True))
    if (gate_up := w.maybe("mlp.gate_up_proj.weight")) is None:  # Phi-3 ships it fused
        gate_up = cat_rows([w("mlp.gate_proj.weight"), w("mlp.up_proj.weight")])
    return GatedMLP(lin(gate_up), lin(w("mlp.down_proj.weight")), activation, fused)


def _qk_scales(cfg, arch: Arch, w: Weights) -> torch.Tensor:
    """key_smoothing.py's q and k factors for this layer, from its weights (read, not
    popped: the layer takes them below)."""
    peek = lambda name: w.state.get(w.prefix + name)  # noqa: E731
    kv_size = cfg.num_key_value_heads * cfg.head_dim
    k_weight, k_bias = peek("self_attn.k_proj.weight"), peek("self_attn.k_proj.bias")
    if k_weight is None:  # Phi-3's fused qkv_proj: the k rows follow the q rows
        q_size = cfg.num_attention_heads * cfg.head_dim
        k_weight = key_smoothing.rows(peek("self_attn.qkv_proj.weight"), q_size, q_size + kv_size)
    one = 1 if arch.gemma else 0  # Gemma's norms are (1 + w)
    k_norm = peek("self_attn.k_norm.weight")
    sizes = key_smoothing.key_magnitudes(
        k_weight, k_bias, peek("input_layernorm.weight") + one,
        None if k_norm is None else k_norm + one, cfg.num_key_value_heads)
    scales = key_smoothing.qk_scales(sizes, cfg.num_attention_heads, cfg.num_key_value_heads,
                                     cfg.head_dim, rotary_dim(cfg, cfg.head_dim))
    return scales.to(peek("input_layernorm.weight").dtype)


def _whole_head_rope(cfg) -> bool:
    """The C RoPE + KV write rotates whole heads; partial rotary takes the torch ops."""
    return rotary_dim(cfg, cfg.head_dim) == cfg.head_dim


def _num_experts(cfg) -> int:
    return getattr(cfg, "num_local_experts", None) or cfg.num_experts


def _is_sparse(cfg, index: int) -> bool:
    """Qwen3-MoE may keep dense MLPs on some layers (mlp_only_layers, decoder_sparse_step)."""
    return (index not in (getattr(cfg, "mlp_only_layers", None) or [])
            and (index + 1) % (getattr(cfg, "decoder_sparse_step", None) or 1) == 0)


class CausalLM(nn.Module):
    def __init__(self, cfg, arch: Arch, weights: dict[str, torch.Tensor],
                 fast: bool | None = None, quantization: str | None = None,
                 linear_weights: str | None = None, smooth_keys: bool = False,
                 kernel_choice: KernelChoice | None = None) -> None:
        """fast=False keeps every op on plain torch (the reference for tests). Weights must
        already be on the target device: oneDNN reorders them here, int8 quantizes them.
        linear_weights="bf16": fp32 weights everywhere but in the linears, which hold bf16
        (the CPU's bf16: model/runner.py). smooth_keys: the KV cache is int8, so the keys
        are stored smoothed (key_smoothing.py). kernel_choice: the linears that can run
        more than one way run the fastest measured (linear/choice.py); None: the default."""
        super().__init__()
        fast = library.enabled() if fast is None else fast
        embed = weights.pop("model.embed_tokens.weight")
        # quantization="gguf": the file's blocks, never a whole float32 table (151936 x 896
        # for Qwen2.5-0.5B: 545 MB)
        self.embed = (embed if isinstance(embed, BlockWeight)
                      else nn.Parameter(embed, requires_grad=False))
        dtype = torch.float32 if isinstance(embed, BlockWeight) else embed.dtype
        # Gemma multiplies the embeddings by sqrt(hidden), rounded to the weights' dtype.
        self.embed_scale = (torch.tensor(cfg.hidden_size ** 0.5, dtype=dtype)
                            if arch.gemma else None)
        device = embed.blocks.device if isinstance(embed, BlockWeight) else embed.device
        self.fused = fast and library.available(device, dtype)
        self.fused_rope = self.fused and _whole_head_rope(cfg)
        linear_weights = "int8" if quantization == "int8" else linear_weights
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, arch, Weights(weights, f"model.layers.{i}."), i, fast, self.fused,
                         linear_weights, smooth_keys, kernel_choice)
            for i in range(cfg.num_hidden_layers))
        norm = weights.pop("model.norm.weight")
        self.norm = RMSNorm(norm + 1 if arch.gemma else norm, cfg.rms_norm_eps, self.fused)
        lm_head = weights.pop("lm_head.weight", None)
        if lm_head is None or getattr(cfg, "tie_word_embeddings", False):
            lm_head = self.embed  # a tied head (GGUF blocks too: then a block linear)
        # bf16's LM head keeps fp32 weights where the bf16 product rounds its output to bf16
        # (oneDNN's): that tied SmolLM2's top logits ("The" and "L" after "What is the
        # capital of France?": argmax flipped). On AMX tiles and in panel_gemm.c's fp32
        # arithmetic the logits stay fp32.
        head_weights = linear_weights
        if linear_weights == "bf16" and not (isinstance(lm_head, torch.Tensor)
                                             and bf16_logits_stay_fp32(lm_head, fast)):
            head_weights = None
        self.lm_head = build_linear(lm_head, None, fast, head_weights, kernel_choice, head=True)
        # A tensor nothing here reads is a part of the model we do not implement (Qwen2-MoE's
        # shared expert, a bias we do not add...): refuse it rather than run without it.
        unused = [k for k in weights if not k.endswith("rotary_emb.inv_freq")]
        if unused:
            raise ValueError(f"checkpoint tensors this architecture does not use: "
                             f"{', '.join(unused[:4])}{' ...' if len(unused) > 4 else ''}")
        self.final_softcap = getattr(cfg, "final_logit_softcapping", None) if arch.gemma else None
        # One RoPE table per layer type that has its own parameters (Gemma 3), else one.
        types = rope_layer_types(cfg)
        # A ModuleDict, so that .to(device) moves the tables with the model.
        self.ropes = nn.ModuleDict({t or "all": RotaryEmbedding(cfg, cfg.head_dim, t)
                                    for t in types or [None]})
        self.layer_rope = [cfg.layer_types[i] if types else "all"
                           for i in range(cfg.num_hidden_layers)]

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
                ) -> torch.Tensor:
        """Hidden states [T, hidden] of the flattened batch; K/V written to the caches
        (k_caches / v_caches: [num_layers, num_blocks, block_size, num_kv_heads, head_dim])."""
        k_caches, v_caches = kv_caches
        x = (self.embed.lookup(input_ids) if isinstance(self.embed, BlockWeight)
             else F.embedding(input_ids, self.embed))
        if self.embed_scale is not None:
            x = x * self.embed_scale
        ropes = {t: rope.tables if self.fused_rope else rope.at(positions, x.dtype)
                 for t, rope in self.ropes.items()}
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, ropes[self.layer_rope[i]], k_caches[i], v_caches[i], meta)
        return self.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits
