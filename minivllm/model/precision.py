"""The runner's precision: the dtype the model's weights and KV cache are configured in, and
the activations' between the ops — with the start-up lines that say how they run.

int8 quantizes the linears and keeps everything else in float32 (linear/int8.py); gguf keeps
a GGUF file's linear weights and embeddings as stored (linear/gguf.py), with float32
activations unless dtype names bfloat16 (then the CPU's bf16 below). bf16 on the CPU is bf16
linear weights and KV cache, with fp32 activations between the ops, so that the C kernels
(fp32) keep running (linear/registry.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from minivllm.config import ModelConfig
from minivllm.model.kernels import library
from minivllm.model.kernels.isa import native_bf16
from minivllm.model.loader import resolve_dtype

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Precision:
    dtype: torch.dtype  # as configured: the KV cache's under kv_cache_dtype auto
    activations: torch.dtype  # float32 where the CPU runs bf16 linear weights
    bf16_weights: bool  # bfloat16 on the CPU: bf16 linear weights, fp32 activations


def resolve_precision(model_config: ModelConfig, hf_config,
                      device: torch.device) -> Precision:
    """The model's precision on `device`; a ValueError for gguf with activations it cannot
    run."""
    quantization = model_config.quantization
    dtype = (torch.float32 if quantization in ("int8", "gguf") and model_config.dtype == "auto"
             else resolve_dtype(model_config.dtype, hf_config, device))
    cpu_bf16 = device.type == "cpu" and dtype == torch.bfloat16
    if quantization == "gguf" and dtype != torch.float32 and not cpu_bf16:
        # The blocks' products, the embeddings' rows and the tied head are fp32.
        raise ValueError(f"dtype={model_config.dtype!r} on {device.type} with "
                         "quantization='gguf' (a GGUF file's default): the blocks run "
                         "with float32 activations there (--dtype float32); --quantization "
                         f"none --dtype {model_config.dtype} dequantizes every weight "
                         "instead")
    if cpu_bf16:
        logger.info("bfloat16 on the CPU: bf16 linear weights (%s), fp32 activations, "
                    "bf16 KV cache", _bf16_linears())
    if quantization == "gguf":
        logger.info("quantization=gguf: the GGUF file's blocks run as stored, float32 "
                    "activations (--quantization none dequantizes every weight to "
                    "--dtype instead)")
    return Precision(dtype, torch.float32 if cpu_bf16 else dtype, cpu_bf16)


def _bf16_linears() -> str:
    """How the CPU's bf16 linears run, for the start-up line."""
    if library.enabled() and library.amx():
        return "AMX-BF16 tiles, the LM head too, fp32 logits"
    if library.enabled() and library.panel_bf16_dot():
        return ("native bf16 dot products, oneDNN's or panel_gemm.c's, the LM head on the "
                "latter, fp32 logits")
    if torch.ops.mkldnn._is_mkldnn_bf16_supported() and native_bf16():
        return "oneDNN, native bf16 dot products; the LM head fp32"
    if library.enabled() and library.panel_width():
        return ("stored in bf16, fp32 arithmetic (no AVX512-BF16: half fp32's bytes per "
                "token, no rounding but the weights'), the LM head too")
    return "emulated: this CPU has no AVX512-BF16 and no AVX2 kernels; float32 is faster here"
