"""The disk tier's I/O against the steps (issue 51): a KV cache that holds one prompt, so
every prompt's blocks are evicted to disk by the next one, then all asked for again.

    python benchmarks/kv_disk_overlap.py [--model FILE.gguf] [--prompts 8] [--prompt-len 512]

Offline engine, greedy, one sequence at a time (--max-num-seqs 1: the others wait).
Round 1 serves N distinct prompts one after another (each evicts the one before: the tier
writes its blocks); round 2 submits them all again at once (each loaded from disk when
admitted; with the prefetcher, read while it waits). Per configuration -- the tier off, and
on -- the mean step time of round 1 and the mean time of round 2's steps that loaded blocks
from disk. Run it on the commit before the overlap too (the synchronous tier). Prints the
CPU, the date and load; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import tempfile
import time
from pathlib import Path

from minivllm import LLM, SamplingParams
from minivllm.bench.machine import cpu_description, when_and_load
from minivllm.engine.messages import make_core_request

BLOCK = 16
_ids = itertools.count()


def run_round(llm: LLM, prompts: list[list[int]], max_tokens: int,
              at_once: bool) -> tuple[list[float], list[float]]:
    """Every step's seconds, and those of the steps that loaded blocks from disk."""
    engine, params = llm.llm_engine, SamplingParams(temperature=0, max_tokens=max_tokens)
    steps, loading, queue = [], [], list(prompts)
    while queue or engine.has_unfinished_requests():
        if queue and (at_once or not engine.has_unfinished_requests()):
            for prompt in queue if at_once else queue[:1]:
                request_id = f"r{next(_ids)}"
                engine.add_request(request_id, make_core_request(request_id, prompt, params),
                                   params)
            queue = [] if at_once else queue[1:]
        hits = llm.stats().kv_disk_hits
        start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - start)
        if llm.stats().kv_disk_hits > hits:
            loading.append(steps[-1])
    return steps, loading


def measure(args, prompts: list[list[int]], disk: Path | None) -> tuple[float, float]:
    tier = ({"kv_offloading_backend": "disk", "kv_offloading_path": str(disk)}
            if disk is not None else {})
    blocks = args.prompt_len // BLOCK + 8  # one prompt and its output
    llm = LLM(str(args.model), num_kv_blocks=blocks, block_size=BLOCK, max_num_seqs=1,
              num_threads=args.threads, **tier)
    first, _ = run_round(llm, prompts, args.max_tokens, at_once=False)
    _, loading = run_round(llm, prompts, args.max_tokens, at_once=True)
    return statistics.mean(first), statistics.mean(loading) if loading else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.model is None:
        from minivllm.bench.qwen25_coder import qwen25_coder_gguf
        args.model = qwen25_coder_gguf()
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 30000) for _ in range(args.prompt_len)]
               for _ in range(args.prompts)]
    print(f"# {cpu_description()}; {args.threads} threads; {args.model.name}; "
          f"{args.prompts} prompts of {args.prompt_len} tokens, {args.max_tokens} out")
    print(f"# {when_and_load()} (start)")
    with tempfile.TemporaryDirectory() as tmp:
        measure(args, prompts[:2], None)  # warm-up: the process's first steps are slower
        off = measure(args, prompts, None)
        on = measure(args, prompts, Path(tmp))
    print(f"# {when_and_load()} (end)")
    print("| tier | round 1 mean step | round 2 mean step loading from disk |")
    print("|---|---|---|")
    print(f"| off | {off[0] * 1e3:.1f} ms | (recomputed) |")
    print(f"| on | {on[0] * 1e3:.1f} ms | {on[1] * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
