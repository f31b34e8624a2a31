"""Key smoothing (model/key_smoothing.py): with an int8 KV cache the keys are stored
divided per channel by s and the queries multiplied by it. It must change nothing but what
the cache stores, and it must make int8 keys with an outlier channel more accurate."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from minivllm import LLM, SamplingParams
from minivllm.model import key_smoothing
from minivllm.model import runner as runner_module
from minivllm.model.models import build_model

PROMPTS = [[1] + [(7 * i + 13 * j) % 90 + 5 for j in range(3 + i % 5)] for i in range(6)]
KWARGS = dict(seed=0, dtype="float32", num_kv_blocks=128, block_size=4)


def _forcing_smoothing(monkeypatch, smooth: bool) -> None:
    """Every model the runner builds from now on smooths its keys (or not), whatever the
    cache's dtype."""
    monkeypatch.setattr(runner_module, "build_model",
                        lambda *a, **k: build_model(*a, **{**k, "smooth_keys": smooth}))


def _scores(llm: LLM, sequences: list[list[int]]) -> list[list[float]]:
    scored = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": s} for s in sequences], scored, use_tqdm=False)
    return [[e[t].logprob for e, t in zip(o.prompt_logprobs[1:], o.prompt_token_ids[1:])]
            for o in outs]


def _greedy(llm: LLM) -> list[list[int]]:
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def test_the_factors_pair_rope_channels_and_follow_the_query_groups():
    sizes = torch.arange(1.0, 17.0)  # 2 KV heads x 8 channels, rotary over the first 6
    factors = key_smoothing.qk_scales(sizes, num_heads=4, num_kv_heads=2, head_dim=8,
                                      rotary_dim=6)
    q, k = factors[:32].view(4, 8), factors[32:].view(2, 8)
    assert torch.allclose(q * k.repeat_interleave(2, dim=0), torch.ones(4, 8))
    assert torch.equal(q[0], q[1]) and torch.equal(q[2], q[3])  # heads 0, 1 read KV head 0
    assert torch.equal(k[:, :3], k[:, 3:6])  # channel c rotates with c + 3
    assert not torch.equal(k[:, 6], k[:, 7])  # past the rotary dims: each its own
    assert not torch.equal(k[0], k[1])


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "phi3", "phi4-mini", "gemma3", "mixtral"])
def test_smoothing_changes_no_score(tiny_model_dirs, monkeypatch, kind):
    """Smoothing forced on with an fp32 cache: the same greedy tokens and the same prompt
    logprobs (to rounding) as the model without it: q.k is unchanged, RoPE pairs, GQA
    groups, partial rotary (phi4-mini), fused qkv (phi3) and k_norm (qwen3, gemma3) alike."""
    model = str(tiny_model_dirs[kind])
    plain = LLM(model, **KWARGS)
    tokens = _greedy(plain)
    sequences = [p + t for p, t in zip(PROMPTS, tokens)]
    base = _scores(plain, sequences)
    del plain
    _forcing_smoothing(monkeypatch, True)
    # Random weights give channels of about one size (and k_norm weights start at 1):
    # spread the estimates 25-fold so that every factor differs.
    estimate, generator = key_smoothing.key_magnitudes, torch.Generator().manual_seed(0)

    def spread(*args) -> torch.Tensor:
        sizes = estimate(*args)
        return sizes * torch.empty_like(sizes).uniform_(-1.6, 1.6, generator=generator).exp()

    monkeypatch.setattr(key_smoothing, "key_magnitudes", spread)
    smoothed = LLM(model, **KWARGS)
    factors = smoothed.llm_engine.runner.model.layers[0].self_attn.qk_scale
    assert factors is not None and factors.std() > 0.3  # the test is not vacuous
    assert _greedy(smoothed) == tokens
    for mine, ref in zip(_scores(smoothed, sequences), base):
        assert mine == pytest.approx(ref, abs=1e-4)


def test_only_an_int8_cache_smooths(tiny_model_dirs):
    model = str(tiny_model_dirs["qwen2"])
    attention = lambda llm: llm.llm_engine.runner.model.layers[0].self_attn  # noqa: E731
    assert attention(LLM(model, **KWARGS)).qk_scale is None
    assert attention(LLM(model, kv_cache_dtype="bfloat16", **KWARGS)).qk_scale is None
    assert attention(LLM(model, kv_cache_dtype="fp8", **KWARGS)).qk_scale is None
    assert attention(LLM(model, kv_cache_dtype="int8", **KWARGS)).qk_scale is not None


@pytest.fixture(scope="module")
def outlier_keys(tiny_model_dirs, tmp_path_factory):
    """The tiny Qwen2 with Qwen2.5's trouble planted: in each layer one key channel pair's
    bias 30 times the keys' typical size."""
    directory = tmp_path_factory.mktemp("outlier") / "qwen2"
    shutil.copytree(tiny_model_dirs["qwen2"], directory)
    path = directory / "model.safetensors"
    weights = load_file(path)
    for name, bias in weights.items():
        if name.endswith("k_proj.bias"):
            bias[[3, 3 + 8]] = 30.0  # head_dim 16: channels 3 and 11 rotate together
    save_file(weights, path, metadata={"format": "pt"})
    return str(directory)


def test_smoothing_makes_int8_keys_with_an_outlier_channel_accurate(outlier_keys,
                                                                    monkeypatch):
    """The mean |dlogprob| of an int8 cache against the fp32 cache, scored on the fp32
    engine's greedy continuations: smoothed well under half the unsmoothed error."""
    fp32 = LLM(outlier_keys, **KWARGS)
    sequences = [p + t for p, t in zip(PROMPTS, _greedy(fp32))]
    base = _scores(fp32, sequences)
    del fp32

    def error() -> float:
        scores = _scores(LLM(outlier_keys, kv_cache_dtype="int8", **KWARGS), sequences)
        deltas = [abs(a - b) for s, r in zip(scores, base) for a, b in zip(s, r)]
        return sum(deltas) / len(deltas)

    smoothed = error()
    _forcing_smoothing(monkeypatch, False)
    unsmoothed = error()
    print(f"int8 cache, mean |dlogprob|: smoothed {smoothed:.4f}, unsmoothed {unsmoothed:.4f}")
    assert smoothed < 0.5 * unsmoothed
