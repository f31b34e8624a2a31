"""Where a step's time goes, offline: schedule, input preparation, forward, sampling and
the engine's output work, at one batch size.

    python benchmarks/step_profile.py [--batch 64 --input-len 128 --output-len 128]
                                      [--temperature 0.8 --top-p 0.95]

Model: random weights in SmolLM-135M's shape, fp32 (minivllm/bench/models.py). The
engine's own functions are wrapped with timers; "engine Python" is everything but the
forward pass (and the block copies): schedule + prepare + sample + outputs. Steps are
split into decode-only steps (the steady state) and steps that carry prefill.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from pathlib import Path

from minivllm import LLM, SamplingParams
from minivllm.bench.models import save_random_model
from minivllm.bench.sampling import add_sampling_args, describe, sampling_fields
from minivllm.bench.throughput import random_prompts
from minivllm.bench.timing import accumulating, timed

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("schedule", "prepare", "forward", "sample", "copies")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=str(ROOT / "results" / "smollm-135m-random"))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    add_sampling_args(parser, greedy=True)
    args = parser.parse_args()
    model = save_random_model("smollm-135m", Path(args.model_dir))
    llm = LLM(str(model), max_model_len=args.input_len + args.output_len + 16,
              max_num_seqs=max(256, args.batch), max_num_batched_tokens=2048)
    sampling = sampling_fields(args)
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, **sampling)
    prompts = [{"prompt_token_ids": p}
               for p in random_prompts(args.batch, args.input_len, llm.llm_engine.vocab_size,
                                       seed=1)]
    llm.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # warm up
    engine, runner = llm.llm_engine, llm.llm_engine.runner
    step_parts: dict[str, float] = defaultdict(float)
    engine.scheduler.schedule = accumulating(step_parts, "schedule", engine.scheduler.schedule)
    runner.batch.prepare = accumulating(step_parts, "prepare", runner.batch.prepare)
    runner.batch.apply = accumulating(step_parts, "prepare", runner.batch.apply)
    runner.model.forward = accumulating(step_parts, "forward", runner.model.forward)
    runner.model.compute_logits = accumulating(step_parts, "forward",
                                               runner.model.compute_logits)
    runner.sampler.sample = accumulating(step_parts, "sample", runner.sampler.sample)
    runner.copy_blocks = accumulating(step_parts, "copies", runner.copy_blocks)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"p{i}", None, params, prompt["prompt_token_ids"])
    totals = {kind: defaultdict(float) for kind in ("decode", "prefill")}
    counts = defaultdict(int)
    while engine.has_unfinished_requests():
        step_parts.clear()
        decode_only = len(engine.scheduler.waiting) == 0 and all(
            r.num_computed_tokens >= r.num_tokens - 1 for r in engine.scheduler.running)
        step_parts["step"] = timed(engine.step)[1]
        kind = "decode" if decode_only else "prefill"
        counts[kind] += 1
        for name, value in step_parts.items():
            totals[kind][name] += value
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.2f}; "
          f"batch {args.batch}, {args.input_len} in / {args.output_len} out, "
          f"{describe(sampling)}")
    print("\n| steps | count | ms/step | " + " | ".join(PARTS) + " | outputs | engine Python |")
    print("|" + "---|" * (len(PARTS) + 5))
    for kind, parts in totals.items():
        if not counts[kind]:
            continue
        step = parts["step"]
        outputs = step - sum(parts[p] for p in PARTS)
        python = parts["schedule"] + parts["prepare"] + parts["sample"] + outputs
        shares = " | ".join(f"{100 * parts[p] / step:.1f}%" for p in PARTS)
        print(f"| {kind} | {counts[kind]} | {1000 * step / counts[kind]:.1f} | {shares} | "
              f"{100 * outputs / step:.1f}% | {100 * python / step:.1f}% |")


if __name__ == "__main__":
    main()
