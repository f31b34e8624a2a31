"""Offline throughput, minivllm vs transformers `generate`, same requests, same run.

    python benchmarks/offline_throughput.py [--num-prompts 32 --input-len 128 --output-len 128]

Model: random weights in SmolLM-135M's shape (built once into --model-dir). transformers
runs the same requests in padded batches of --hf-batch-size (all prompts have the same
length, so there is no padding waste), greedy (or the sampling flags given, for both
engines), EOS ignored.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
from random_model import save_random_model

from minivllm.bench.sampling import (
    add_sampling_args,
    describe,
    hf_generate_kwargs,
    sampling_fields,
)
from minivllm.bench.throughput import ThroughputResult, random_prompts, run_minivllm


def run_transformers(model_dir, prompts, output_len, batch_size, sampling: dict
                     ) -> ThroughputResult:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(prompts), batch_size):
            batch = torch.tensor(prompts[i:i + batch_size])
            out = model.generate(batch, attention_mask=torch.ones_like(batch),
                                 max_new_tokens=output_len, min_new_tokens=output_len,
                                 pad_token_id=0, **hf_generate_kwargs(sampling))
            assert out.shape[1] == batch.shape[1] + output_len
    return ThroughputResult(len(prompts), len(prompts[0]), output_len,
                            time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", default="results/smollm-135m-random")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--hf-batch-size", type=int, default=16)
    add_sampling_args(parser, greedy=True)
    args = parser.parse_args()
    sampling = sampling_fields(args)
    model_dir = save_random_model("smollm-135m", args.model_dir)
    prompts = random_prompts(args.num_prompts, args.input_len, 49152)
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} "
          f"threads, torch {torch.__version__}; {describe(sampling)}")
    ours = run_minivllm(str(model_dir), prompts, args.output_len, sampling=sampling,
                        kv_cache_space=2.0, swap_space=0.1)
    print(f"minivllm:     {ours.output_tokens_per_s:8.1f} output tok/s ({ours.elapsed_s:.1f} s)")
    theirs = run_transformers(model_dir, prompts, args.output_len, args.hf_batch_size,
                              sampling)
    print(f"transformers: {theirs.output_tokens_per_s:8.1f} output tok/s ({theirs.elapsed_s:.1f} s)"
          f" [batch {args.hf_batch_size}]")
    print(f"ratio minivllm / transformers: "
          f"{ours.output_tokens_per_s / theirs.output_tokens_per_s:.2f}x")


if __name__ == "__main__":
    main()
