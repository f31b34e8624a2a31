"""Perplexity from the engine's prompt logprobs: of given token sequences, or of a text cut
into windows of a fixed number of tokens (as llama.cpp's `llama-perplexity` does with its
context size), for benchmarks/quant_accuracy.py and the real-model tests."""

from __future__ import annotations

import math

from minivllm import LLM, SamplingParams


def scored(llm: LLM, sequences: list[list[int]]) -> list[list[float]]:
    """The logprob of each token after the first of each sequence, teacher-forced."""
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
    outputs = llm.generate([{"prompt_token_ids": s} for s in sequences], params,
                           use_tqdm=False)
    return [[entry[token].logprob for entry, token in
             zip(out.prompt_logprobs[1:], out.prompt_token_ids[1:])] for out in outputs]


def windows(tokens: list[int], size: int, limit: int | None = None) -> list[list[int]]:
    """Consecutive windows of `size` tokens (the first `limit` of them); the tail shorter
    than a window is left out. Each is scored as its own sequence: its first token only
    gives context."""
    cut = [tokens[i:i + size] for i in range(0, len(tokens) - size + 1, size)]
    return cut if limit is None else cut[:limit]


def perplexity(logprobs: list[list[float]]) -> float:
    flat = [lp for seq in logprobs for lp in seq]
    return math.exp(-sum(flat) / len(flat))
