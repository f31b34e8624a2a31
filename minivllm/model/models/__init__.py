"""Supported architectures, by the name in config.json's `architectures`, and the check
that a config asks for nothing the decoder does not implement: a field we would ignore
fails at load, naming it, rather than giving silently different output."""

from __future__ import annotations

import torch

from minivllm.model.models.decoder import Arch, CausalLM
from minivllm.model.models.layers import ACTIVATIONS

ARCHITECTURES = {
    "LlamaForCausalLM": Arch(),
    "MistralForCausalLM": Arch(),
    "Qwen2ForCausalLM": Arch(),  # q/k/v bias comes with the weights
    "Qwen3ForCausalLM": Arch(),  # q_norm / k_norm come with the weights
    "Phi3ForCausalLM": Arch(),  # fused qkv_proj / gate_up_proj in the checkpoint
    "MixtralForCausalLM": Arch(experts="mixtral"),
    "Qwen3MoeForCausalLM": Arch(experts="qwen3_moe"),
    "Gemma2ForCausalLM": Arch(gemma=True, attn_softcap=True),
    "Gemma3ForCausalLM": Arch(gemma=True),
}

_LAYER_TYPES = {"full_attention", "sliding_attention"}


def head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _set(cfg, field: str) -> bool:
    return getattr(cfg, field, None) not in (None, False, 0)


def check_config(name: str, arch: Arch, cfg) -> None:
    """Raise ValueError naming the first config field that asks for something we lack."""
    def unsupported(field: str, why: str) -> ValueError:
        return ValueError(f"{name}: unsupported config field {field}="
                          f"{getattr(cfg, field, None)!r} ({why})")

    if not arch.gemma:
        for field in ("attn_logit_softcapping", "final_logit_softcapping",
                      "query_pre_attn_scalar"):
            if _set(cfg, field):
                raise unsupported(field, f"transformers' {name} has no such thing")
    elif not arch.attn_softcap and _set(cfg, "attn_logit_softcapping"):
        raise unsupported("attn_logit_softcapping", f"transformers' {name} ignores it")
    for field in ("mlp_bias", "use_bidirectional_attention"):
        if _set(cfg, field):
            raise unsupported(field, "not implemented")
    activation_field = "hidden_activation" if _set(cfg, "hidden_activation") else "hidden_act"
    if getattr(cfg, activation_field, "silu") not in ACTIVATIONS:
        raise unsupported(activation_field, f"supported: {', '.join(ACTIVATIONS)}")
    if not set(getattr(cfg, "layer_types", None) or ()) <= _LAYER_TYPES:
        raise unsupported("layer_types", f"supported: {', '.join(sorted(_LAYER_TYPES))}")
    if arch.experts is None and (_set(cfg, "num_local_experts") or _set(cfg, "num_experts")):
        raise unsupported("num_experts", f"{name} is dense")


def build_model(cfg, weights: dict[str, torch.Tensor], quantization: str | None = None,
                linear_weights: str | None = None, smooth_keys: bool = False,
                kernel_choice=None) -> torch.nn.Module:
    architectures = getattr(cfg, "architectures", None) or []
    for name in architectures:
        if name in ARCHITECTURES:
            cfg.head_dim = head_dim(cfg)
            check_config(name, ARCHITECTURES[name], cfg)
            return CausalLM(cfg, ARCHITECTURES[name], weights, quantization=quantization,
                            linear_weights=linear_weights, smooth_keys=smooth_keys,
                            kernel_choice=kernel_choice)
    raise ValueError(
        f"unsupported architecture {architectures}; supported: {', '.join(ARCHITECTURES)}"
    )
