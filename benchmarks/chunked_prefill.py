"""Decode inter-token latency while long prompts arrive: chunked prefill vs not, same run.

    python benchmarks/chunked_prefill.py [--model DIR --decoders 8 --long-prompts 4 --long-len 1500]

--decoders requests decode steadily; after a few steps --long-prompts long prompts arrive.
Without chunking each long prompt is prefilled in one step and every decode waits for it;
with chunked prefill (--chunk tokens per step) decodes keep flowing. Prints the decode
ITL p50 / p99 / max of both. Default model: random weights in SmolLM-135M's shape.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

from minivllm.bench.models import save_random_model
from minivllm.bench.sampling import (
    add_sampling_args,
    model_defaults,
    offline_params,
    sampling_fields,
)
from minivllm.bench.throughput import random_prompts
from minivllm.config import EngineConfig
from minivllm.engine.llm_engine import LLMEngine


def run(model: str, args, chunked: bool) -> list[float]:
    engine = LLMEngine(EngineConfig(
        model=model, enable_chunked_prefill=chunked, kv_cache_space=1.0, swap_space=0.01,
        max_num_batched_tokens=args.chunk if chunked else args.long_len + 64))
    vocab = engine.vocab_size
    base, sampling = model_defaults(engine.config), sampling_fields(args)
    decode = offline_params(sampling, base, max_tokens=args.decode_len, ignore_eos=True)
    for i, p in enumerate(random_prompts(args.decoders, 16, vocab, seed=1)):
        engine.add_request(f"d{i}", None, decode, p)
    last_token: dict[str, float] = {}
    gaps: list[float] = []
    step = 0
    while engine.has_unfinished_requests():
        step += 1
        if step == 5:  # the decoders are running: now the long prompts arrive
            long = offline_params(sampling, base, max_tokens=4, ignore_eos=True)
            for i, p in enumerate(random_prompts(args.long_prompts, args.long_len, vocab, 2)):
                engine.add_request(f"long{i}", None, long, p)
        for out in engine.step():
            if out.request_id.startswith("d"):
                now = time.perf_counter()
                if out.request_id in last_token:
                    gaps.append(now - last_token[out.request_id])
                last_token[out.request_id] = now
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--decoders", type=int, default=8)
    parser.add_argument("--decode-len", type=int, default=64)
    parser.add_argument("--long-prompts", type=int, default=4)
    parser.add_argument("--long-len", type=int, default=1500)
    parser.add_argument("--chunk", type=int, default=256)
    add_sampling_args(parser, greedy=True)
    args = parser.parse_args()
    model = args.model or str(save_random_model(
        "smollm-135m", Path(__file__).resolve().parents[1] / "results" / "smollm-135m-random"))
    print(f"machine: {platform.machine()}; {args.decoders} decoders, {args.long_prompts} "
          f"prompts of {args.long_len} tokens arriving at step 5")
    for chunked in (False, True):
        gaps = sorted(run(model, args, chunked))
        p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
        label = f"chunked ({args.chunk}/step)" if chunked else "not chunked     "
        print(f"{label}: decode ITL p50 {statistics.median(gaps) * 1000:7.1f} ms, "
              f"p99 {p99 * 1000:7.1f} ms, max {gaps[-1] * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
