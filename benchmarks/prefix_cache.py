"""Prefix caching on vs off: many requests sharing a long system prompt, same run.

    python benchmarks/prefix_cache.py [--model minivllm-demo --num-requests 32 --system-len 384]

Each request is the same system prompt plus its own user suffix; they arrive one every
--interval-ms (offline engine, submitted as the engine steps). Prints mean TTFT, total time
and the ratios, with prefix caching on and off.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from minivllm.bench.sampling import (
    add_sampling_args,
    model_defaults,
    offline_params,
    sampling_fields,
)
from minivllm.bench.throughput import random_prompts
from minivllm.config import EngineConfig
from minivllm.engine.llm_engine import LLMEngine


def run(model: str, prompts: list[list[int]], output_len: int, interval_s: float,
        caching: bool, sampling: dict) -> tuple[float, float, float]:
    engine = LLMEngine(EngineConfig(model=model, enable_prefix_caching=caching,
                                    kv_cache_space=0.5, swap_space=0.01))
    params = offline_params(sampling, model_defaults(engine.config), max_tokens=output_len,
                            ignore_eos=True)
    ttfts, pending, start = [], list(enumerate(prompts)), time.perf_counter()
    while pending or engine.has_unfinished_requests():
        now = time.perf_counter()
        while pending and now - start >= pending[0][0] * interval_s:
            i, prompt = pending.pop(0)
            engine.add_request(str(i), None, params, prompt)
        for out in engine.step():
            if out.finished:
                ttfts.append(out.metrics.first_token_time - out.metrics.arrival_time)
    return statistics.mean(ttfts), time.perf_counter() - start, engine.get_stats().prefix_cache_hit_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minivllm-demo")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--system-len", type=int, default=384)
    parser.add_argument("--user-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--interval-ms", type=float, default=20)
    add_sampling_args(parser, greedy=True)
    args = parser.parse_args()
    vocab = LLMEngine(EngineConfig(model=args.model, num_kv_blocks=1)).vocab_size
    system = random_prompts(1, args.system_len, vocab, seed=1)[0]
    prompts = [system + user for user in random_prompts(args.num_requests, args.user_len,
                                                        vocab, seed=2)]
    print(f"machine: {platform.machine()}; model {args.model}; {args.num_requests} requests of "
          f"{args.system_len} shared + {args.user_len} own tokens, {args.output_len} out")
    results = {}
    for caching in (False, True):
        ttft, total, hit_rate = run(args.model, prompts, args.output_len,
                                    args.interval_ms / 1000, caching, sampling_fields(args))
        results[caching] = (ttft, total)
        print(f"prefix caching {'on ' if caching else 'off'}: mean TTFT {ttft * 1000:8.1f} ms, "
              f"total {total:6.2f} s, hit rate {hit_rate:.1%}")
    (ttft_off, total_off), (ttft_on, total_on) = results[False], results[True]
    print(f"ratio (off / on): TTFT {ttft_off / ttft_on:.2f}x, throughput {total_off / total_on:.2f}x")


if __name__ == "__main__":
    main()
