"""Batch-1 decode and a 512-token prefill of one GGUF file at each thread count, minivllm
against llama-server (`make peer-llama-server`), one client for both (gguf_serving.py's
servers and `minivllm bench serve`), engines alternating within each round.

    python benchmarks/thread_scaling.py                          # 1, 2, ... every core
    python benchmarks/thread_scaling.py --model FILE.gguf --threads 1 2 8 16 --rounds 3

Decode: random 128-token prompts, 128 tokens out, EOS ignored: output tok/s (1 / TPOT p50).
Prefill: random 512-token prompts, 1 token out: TTFT p50 (the prefill and its one token).
Each row gives both engines' medians over the rounds and minivllm's ratio (the median of
the rounds' ratios); the copy bandwidth at that thread count and the decode roof it makes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gguf_serving import LLAMA_SERVER, local_tokenizer, one_round, step_bytes  # noqa: E402

from minivllm.bench.machine import cpu_description, when_and_load  # noqa: E402
from minivllm.bench.peaks import memory_bandwidth  # noqa: E402
from minivllm.bench.qwen25_coder import qwen25_coder_gguf  # noqa: E402

ENGINES = ["minivllm", "llama-server"]


def measure(model: Path, tokenizer: Path, threads: int, work: Path) -> dict:
    """One round at `threads`: each engine's decode tok/s and prefill TTFT (ms)."""
    # no sampling fields: each server's defaults (the output is timed, EOS ignored)
    common = dict(concurrency=[1], prompts_per_slot=3, min_prompts=3, threads=threads)
    decode = one_round(ENGINES, model, tokenizer, SimpleNamespace(
        input_len=128, output_len=128, **common), work)
    prefill = one_round(ENGINES, model, tokenizer, SimpleNamespace(
        input_len=512, output_len=1, **common), work)
    return {engine: {"tok/s": 1e3 / decode[engine, 1]["tpot_p50_ms"],
                     "prefill_ms": prefill[engine, 1]["ttft_p50_ms"]} for engine in ENGINES}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None, help="default: Qwen2.5-Coder-0.5B")
    p.add_argument("--threads", type=int, nargs="+",
                   default=sorted({1, 2, len(os.sched_getaffinity(0))}))
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if not LLAMA_SERVER.exists():
        sys.exit(f"{LLAMA_SERVER} is missing: build it with `make peer-llama-server`")
    model = args.model or qwen25_coder_gguf()
    step = step_bytes(model)
    print(f"# {model.name}: {cpu_description()}")
    print(f"# {when_and_load()} (start); {args.rounds} rounds, engines alternating")
    print("| threads | decode tok/s minivllm / llama-server | ratio | roof tok/s (copy GB/s) "
          "| prefill 512 ms minivllm / llama-server | ratio |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tokenizer = local_tokenizer(model, work / "tokenizer")
        for threads in args.threads:
            bandwidth = memory_bandwidth(threads)
            rounds = [measure(model, tokenizer, threads, work) for _ in range(args.rounds)]
            med = {e: {k: statistics.median(r[e][k] for r in rounds) for k in rounds[0][e]}
                   for e in ENGINES}
            decode = statistics.median(r["minivllm"]["tok/s"] / r["llama-server"]["tok/s"]
                                       for r in rounds)
            prefill = statistics.median(r["llama-server"]["prefill_ms"]
                                        / r["minivllm"]["prefill_ms"] for r in rounds)
            ours, theirs = med["minivllm"], med["llama-server"]
            print(f"| {threads} | {ours['tok/s']:.1f} / {theirs['tok/s']:.1f} | {decode:.2f}x "
                  f"| {bandwidth / step['minivllm']:.1f} ({bandwidth / 1e9:.1f}) "
                  f"| {ours['prefill_ms']:.0f} / {theirs['prefill_ms']:.0f} | {prefill:.2f}x |")
    print(f"# {when_and_load()} (end)")


if __name__ == "__main__":
    main()
