"""Issue 49's quality target on the real Qwen2.5-Coder-0.5B-Instruct Q4_K_M file: the
perplexity of its own blocks as run (quantization="gguf": Q4_K, Q5_0, Q6_K and Q8_0 blocks
with int8 activations per block of 32) within 0.1% of the same blocks dequantized to float32
(what the gguf package and llama.cpp compute from the file), on a held-out text:
benchmarks/data/heldout_python.txt, 433 lines of this repository's own Python (written
after the model was trained; benchmarks/data/heldout_python.md), in 8 windows of 512
tokens, each scored from its prompt logprobs.

Measured 2026-11-28 (AVX512-VNNI Xeon, no AMX): float32 11.1968, gguf 11.2041, +0.065%.
The AVX2 and AVX-512 kernels compute the same integer sums, so the same figure; on a CPU
with AMX the prefills run the AMX tiles (bf16 activations) for Q8_0 and Q4_K instead.
`python benchmarks/quant_accuracy.py --models qwen2.5-coder --modes fp32 gguf --text
benchmarks/data/heldout_python.txt --window 512` gives the same perplexities with the
other accuracy measures (docs/quantization.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from minivllm import LLM
from minivllm.bench.perplexity import perplexity, scored, windows
from tests.model import test_real_qwen25_coder as qwen

pytestmark = pytest.mark.real_model

# The other file's fixtures: the model assembled once, in the user's cache
user_cache, qwen_gguf = qwen.user_cache, qwen.qwen_gguf
TEXT = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "heldout_python.txt"
WINDOW = 512
TARGET = 0.001  # issue 49: within 0.1%


def test_gguf_blocks_perplexity_within_target_of_the_dequantized_file(qwen_gguf):
    ppl = {}
    for mode, options in {"float32": {"quantization": "none"},
                          "gguf": {"quantization": "gguf"}}.items():
        llm = LLM(str(qwen_gguf), dtype="float32", num_kv_blocks=128, **options)
        sequences = windows(llm.get_tokenizer().encode(TEXT.read_text()), WINDOW)
        assert len(sequences) == 8
        ppl[mode] = perplexity(scored(llm, sequences))
        del llm
    gap = ppl["gguf"] / ppl["float32"] - 1
    print(f"perplexity of {TEXT.name}: float32 {ppl['float32']:.4f}, gguf "
          f"{ppl['gguf']:.4f} ({100 * gap:+.3f}%)")
    # The text and the float32 path are the ones measured (transformers checks that path)
    assert ppl["float32"] == pytest.approx(11.1968, rel=1e-3)
    assert abs(gap) <= TARGET, ppl


def test_int8_kv_cache_perplexity_within_half_a_percent_of_bf16(qwen_gguf):
    """Issue 51's quality target for --kv-cache-dtype int8 on the same text and windows.
    Qwen2's k_proj bias gives a few key channels 24-60x the median one; with one scale per
    token and head that cost +0.68% over the bf16 cache. Smoothed keys
    (model/key_smoothing.py), measured 2026-11-28: bf16 cache 11.206, int8 11.199."""
    ppl = {}
    for kv in ("bfloat16", "int8"):
        llm = LLM(str(qwen_gguf), dtype="float32", quantization="none", num_kv_blocks=128,
                  kv_cache_dtype=kv)
        ppl[kv] = perplexity(scored(llm, windows(
            llm.get_tokenizer().encode(TEXT.read_text()), WINDOW)))
        del llm
    gap = ppl["int8"] / ppl["bfloat16"] - 1
    print(f"perplexity of {TEXT.name}: bf16 cache {ppl['bfloat16']:.4f}, int8 cache "
          f"{ppl['int8']:.4f} ({100 * gap:+.3f}%)")
    assert abs(gap) <= 0.005, ppl
