"""Decode tokens/s of a small mixture-of-experts model (Qwen3-MoE layout) against a dense
model (Qwen3) with the same active parameters per token, alternating.

    python benchmarks/moe_vs_dense.py [--threads 2 --rounds 3 --batch 1 16]

Both are random-weight models built here: the same attention, embeddings and depth; the
MoE's MLP is NUM_EXPERTS experts of MOE_INTERMEDIATE with top-TOP_K routing, the dense
model's one MLP of TOP_K * MOE_INTERMEDIATE, so a token multiplies the same number of
weights in both (the router's few more aside) while the MoE holds NUM_EXPERTS / TOP_K times
the MLP weights. For each batch size, rounds alternate dense and MoE (A B A B ...): each
generates max_tokens greedy tokens for every prompt of the batch; prints each one's median
tokens/s and the median of the per-round ratios, with the date and load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from random_model import save_word_tokenizer  # benchmarks/, this script's folder

from minivllm import LLM, SamplingParams

SHAPE = dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
             num_key_value_heads=4, head_dim=64, vocab_size=8192,
             max_position_embeddings=1024, tie_word_embeddings=True)
NUM_EXPERTS, TOP_K, MOE_INTERMEDIATE = 16, 2, 384


def build(kind: str, directory: Path) -> Path:
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

    torch.manual_seed(0)
    if kind == "moe":
        config = Qwen3MoeConfig(**SHAPE, bos_token_id=1, eos_token_id=2, num_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K,
                                moe_intermediate_size=MOE_INTERMEDIATE, norm_topk_prob=True)
    else:
        config = Qwen3Config(**SHAPE, bos_token_id=1, eos_token_id=2, intermediate_size=TOP_K * MOE_INTERMEDIATE)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory)
    save_word_tokenizer(directory, SHAPE["vocab_size"])
    return directory


def tokens_per_second(llm: LLM, batch: int, prompt_len: int, max_tokens: int) -> float:
    prompts = [{"prompt_token_ids": [(31 * i + 7 * j) % 8000 + 3 for j in range(prompt_len)]}
               for i in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        llms = {kind: LLM(str(build(kind, Path(tmp) / kind)), num_threads=args.threads,
                          num_kv_blocks=1024) for kind in ("dense", "moe")}
        now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        print(f"{now}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
              f"{args.threads} threads, hidden {SHAPE['hidden_size']}, "
              f"{SHAPE['num_hidden_layers']} layers, MoE {NUM_EXPERTS} experts top-{TOP_K} "
              f"of {MOE_INTERMEDIATE} vs dense {TOP_K * MOE_INTERMEDIATE}, prompts of "
              f"{args.prompt_len}, {args.max_tokens} tokens each, {args.rounds} rounds")
        print("| batch | dense tok/s | MoE tok/s | MoE / dense |\n|---|---|---|---|")
        for batch in args.batch:
            for llm in llms.values():  # warm-up: oneDNN kernels for these row counts
                tokens_per_second(llm, batch, args.prompt_len, 4)
            rates = {kind: [] for kind in llms}
            for _ in range(args.rounds):
                for kind, llm in llms.items():
                    rates[kind].append(tokens_per_second(llm, batch, args.prompt_len,
                                                         args.max_tokens))
            ratios = [m / d for m, d in zip(rates["moe"], rates["dense"])]
            print(f"| {batch} | {statistics.median(rates['dense']):.1f} | "
                  f"{statistics.median(rates['moe']):.1f} | {statistics.median(ratios):.2f}x "
                  f"({min(ratios):.2f}-{max(ratios):.2f}) |", flush=True)


if __name__ == "__main__":
    main()
