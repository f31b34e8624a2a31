"""What `--kernel-choice measure` buys: offline batches with each linear's measured fastest
way against the default ways, in one run, alternating.

    python benchmarks/kernel_choice.py [--model results/smollm2-135m-instruct]
        [--batch-sizes 1 64] [--input-len 128 --output-len 128] [--rounds 3] [--dtype auto]

Each round builds both engines in turn (measure first: its times are taken at its first
start, into a fresh cache folder, so the choices are this quiet machine's) and runs the same
random-token prompts, greedy, EOS ignored. Prints output tok/s per engine, their ratio per
round and the median, the ways the measured engine chose, the CPU, threads and load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from minivllm.bench.machine import cpu_description, when_and_load

ROOT = Path(__file__).resolve().parents[1]


def chosen_ways(model) -> Counter:
    """How many linears run each way (a ChosenLinear counts each of its buckets' ways)."""
    from minivllm.model.linear.choice import ChosenLinear

    counts: Counter = Counter()
    layers = [model.lm_head, *(m for layer in model.layers for m in (
        layer.self_attn.qkv, layer.o_proj, getattr(layer.mlp, "gate_up", None),
        getattr(layer.mlp, "down", None)) if m is not None)]
    for lin in layers:
        if isinstance(lin, ChosenLinear):
            counts.update(f"{name} (per bucket)" for name in lin.winners)
        else:
            counts[type(lin).__name__ + (" oneDNN" if getattr(lin, "onednn", False) else "")] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "results" / "smollm2-135m-instruct"))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()

    from minivllm import LLM, SamplingParams

    os.environ["MINIVLLM_CACHE_DIR"] = tempfile.mkdtemp(prefix="kernel-choice-")
    print(f"CPU: {cpu_description()}; started {when_and_load()}")
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0)
    rates: dict[tuple[str, int], list[float]] = {}
    for round_ in range(args.rounds):
        for choice in ("measure", "default"):
            t0 = time.perf_counter()
            llm = LLM(model=args.model, dtype=args.dtype, kernel_choice=choice)
            load_s = time.perf_counter() - t0
            if round_ == 0 and choice == "measure":
                model = llm.llm_engine.core.runner.model
                print(f"measured at load ({load_s:.1f} s with the model): "
                      f"{dict(chosen_ways(model))}")
            for batch in args.batch_sizes:
                vocab = llm.llm_engine.vocab_size
                prompts = [{"prompt_token_ids": rng.integers(3, vocab, args.input_len).tolist()}
                           for _ in range(batch)]
                start = time.perf_counter()
                llm.generate(prompts, params, use_tqdm=False)
                rate = batch * args.output_len / (time.perf_counter() - start)
                rates.setdefault((choice, batch), []).append(rate)
                print(f"round {round_ + 1}: {choice}, batch {batch}: {rate:.1f} tok/s", flush=True)
            del llm
    print("\n| batch | measure tok/s | default tok/s | ratio (median of rounds) |\n|---|---|---|---|")
    for batch in args.batch_sizes:
        m, d = rates[("measure", batch)], rates[("default", batch)]
        ratios = [a / b for a, b in zip(m, d)]
        print(f"| {batch} | {statistics.median(m):.1f} | {statistics.median(d):.1f} | "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |")
    print(f"finished {when_and_load()}")


if __name__ == "__main__":
    main()
