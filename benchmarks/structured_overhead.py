"""What a constrained request costs per token, beside unconstrained ones in the same batch.

    python benchmarks/structured_overhead.py [--model DIR] [--batch 8] [--tokens 64]
                                             [--rounds 5]

Each round generates --tokens tokens (ignore_eos) for --batch prompts twice, in alternating
order: "plain", every request unconstrained, and "mixed", half of them constrained by a JSON
schema that never completes within --tokens (an array of objects with free strings), so
that every step masks the constrained rows. Prints the medians of the seconds per step of
each, their ratio, and the time the constraint's own work took (bitmask, masking, matcher
advance: the sampler's calls, timed) per constrained token; with date and load.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
from pathlib import Path

import minivllm
from minivllm import LLM, SamplingParams
from minivllm.bench.timing import accumulating, timed
from minivllm.model import sampler as sampler_module
from minivllm.sampling_params import StructuredOutputsParams

SCHEMA = {"type": "array", "items": {"type": "object", "properties": {
    "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "tags"]}}
PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom", "One day", "The sun",
           "A big red ball", "Mom said", "The cat"]

SPENT: dict[str, float] = {}  # seconds in the constraint's sampler work


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=str(Path(minivllm.__file__).parent / "demo_model"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    # The constraint's own work in the sampler: the bitmask and the masking (the matcher's
    # advance, a call inside sample(), is not timed apart).
    sampler_module.fill_bitmask = accumulating(SPENT, "mask", sampler_module.fill_bitmask)
    sampler_module.apply_bitmask = accumulating(SPENT, "mask", sampler_module.apply_bitmask)
    llm = LLM(model=args.model, max_num_seqs=args.batch)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.batch)]
    plain = [SamplingParams(temperature=1.0, seed=i, max_tokens=args.tokens, ignore_eos=True)
             for i in range(args.batch)]
    constraint = StructuredOutputsParams(json=SCHEMA)
    mixed = [SamplingParams(temperature=1.0, seed=i, max_tokens=args.tokens, ignore_eos=True,
                            structured_outputs=constraint if i % 2 else None)
             for i in range(args.batch)]
    llm.generate(prompts, mixed, use_tqdm=False)  # warm-up, and the grammar compiled
    times: dict[str, list[float]] = {"plain": [], "mixed": []}
    per_token: list[float] = []
    for r in range(args.rounds):
        for name in (("plain", "mixed") if r % 2 == 0 else ("mixed", "plain")):
            SPENT.clear()
            outputs, elapsed = timed(llm.generate, prompts,
                                     plain if name == "plain" else mixed, use_tqdm=False)
            assert all(len(o.outputs[0].token_ids) == args.tokens for o in outputs)
            times[name].append(elapsed / args.tokens)
            if name == "mixed":
                per_token.append(SPENT.get("mask", 0.0) / (args.tokens * (args.batch // 2)))
    plain_s, mixed_s = statistics.median(times["plain"]), statistics.median(times["mixed"])
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load "
          f"{os.getloadavg()[0]:.2f}; {args.model}, batch {args.batch} "
          f"({args.batch // 2} constrained in mixed), {args.tokens} tokens, "
          f"{args.rounds} alternating rounds")
    print(f"plain: {plain_s * 1e3:.2f} ms/step   mixed: {mixed_s * 1e3:.2f} ms/step   "
          f"mixed/plain: {mixed_s / plain_s:.3f}")
    print(f"bitmask + masking: {statistics.median(per_token) * 1e6:.0f} us per constrained "
          f"token")


if __name__ == "__main__":
    main()
