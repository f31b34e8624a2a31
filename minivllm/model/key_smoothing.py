"""Key smoothing for an int8 KV cache (--kv-cache-dtype int8).

A quantized cache keeps one scale per token and KV head (kv_quant.py), so in int8 a key's
largest channel sets the step for all of its channels (fp8's steps follow each value's size:
kv_quant.QuantFormat.smooth_keys says which formats smooth). Some models have key channels far larger
than the rest: Qwen2's k_proj bias makes a head's largest channel 24-60x its median in
layers 0, 1 and 8 of Qwen2.5-Coder-0.5B, and int8 then spends its 255 steps on them.

Attention only needs q . k, so each key channel c can be stored divided by s_c if the
query's channel c is multiplied by s_c: the scores are the same (exactly so in real
arithmetic), while the stored keys have channels of similar size. RoPE rotates channel c
with channel c + rotary_dim / 2; giving both the same s makes the scaling commute with
the rotation, so it is applied before RoPE, on the q/k projection's output, and the C
RoPE + KV write and every attention kernel are unchanged. It runs only with an int8 cache:
the other caches see the model's own keys.

s is fixed at load, from the weights alone (so that a restarted server stores the same
bytes: the disk tier's blocks stay valid): a channel's size is estimated as
|bias_c| + ||W_c * input_norm||_2 (the key of a unit-RMS input), or |k_norm_c| where the
model normalizes each key head (Qwen3, Gemma 3). Over Qwen2.5-Coder-0.5B's layers the log
of this estimate correlates 0.65-0.99 with the log of the channels' measured maxima.
"""

from __future__ import annotations

import torch

from minivllm.model.linear.gguf import BlockWeight

# s = (size / median size) ** STRENGTH: 1 would make every stored channel the same size, but
# q * s then magnifies the rounding of the large channels. Qwen2.5-Coder-0.5B, perplexity of
# heldout_python.txt in windows of 512 (fp32 cache 11.197), strength 0 / 0.25 / 0.5 / 0.75 /
# 1: int8 11.283 / 11.237 / 11.199 / 11.194 / 11.210, fp8 (e4m3, whose steps already follow
# each value's size) 11.334 / 11.315 / 11.318 / 11.343 / 11.485.
STRENGTH = 0.5


def rows(weight: torch.Tensor | BlockWeight, start: int, stop: int) -> torch.Tensor:
    """Rows start:stop of a weight as fp32."""
    if isinstance(weight, BlockWeight):
        return weight.dequantize()[start:stop]
    return weight[start:stop].float()


def key_magnitudes(k_weight: torch.Tensor | BlockWeight, k_bias: torch.Tensor | None,
                   input_norm: torch.Tensor, k_norm: torch.Tensor | None,
                   num_kv_heads: int) -> torch.Tensor:
    """Each key channel's estimated size, [KVH * D] fp32. k_weight: the k projection's
    rows [KVH * D, hidden]; input_norm: the layer's effective input RMSNorm weight
    (Gemma's 1 + w)."""
    if k_norm is not None:  # normalized heads: the norm weight is the channel's size
        return k_norm.float().abs().repeat(num_kv_heads)
    w = rows(k_weight, 0, k_weight.shape[0])
    size = (w * input_norm.float()).norm(dim=1)
    return size + k_bias.float().abs() if k_bias is not None else size


def qk_scales(magnitudes: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
              rotary_dim: int) -> torch.Tensor:
    """The factors for q and k, one vector [H * D + KVH * D]: s for every query head (a KV
    head's s repeated over its group of query heads), 1 / s for the keys. s_c is the
    channel's size over the layer's median, to the power STRENGTH, the same for both
    channels of a RoPE pair."""
    size = magnitudes.view(num_kv_heads, head_dim).clone()
    half = rotary_dim // 2
    pair = torch.maximum(size[:, :half], size[:, half:rotary_dim])
    size[:, :half], size[:, half:rotary_dim] = pair, pair
    size = size.clamp_min(size.max() * 1e-3)  # a dead channel keeps a finite factor
    s = (size / size.median()) ** STRENGTH
    q = s.repeat_interleave(num_heads // num_kv_heads, dim=0)
    return torch.cat([q.flatten(), (1 / s).flatten()])
