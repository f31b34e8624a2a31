"""Supported architectures, by the name in config.json's `architectures`."""

from __future__ import annotations

import torch

from minivllm.model.models.llama import LlamaForCausalLM

MODEL_REGISTRY = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
}


def head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def build_model(cfg, weights: dict[str, torch.Tensor],
                quantization: str | None = None) -> torch.nn.Module:
    architectures = getattr(cfg, "architectures", None) or []
    for name in architectures:
        if name in MODEL_REGISTRY:
            cfg.head_dim = head_dim(cfg)
            return MODEL_REGISTRY[name](cfg, weights, quantization=quantization)
    raise ValueError(
        f"unsupported architecture {architectures}; supported: {', '.join(MODEL_REGISTRY)}"
    )
