"""The served plan check (benchmarks/sim_plan_check.py --served) never re-sends a prompt
into the server's warm prefix cache: every run, the warm-up's included, draws prompts no
other run drew (a shared first KV block would be a cache hit)."""

from __future__ import annotations

import asyncio
from itertools import combinations

from minivllm.bench.prompts import build_prompts
from minivllm.bench.traces import build_trace
from minivllm.sim.served_check import served_runs
from tests.bench.test_bench_prompts import word_level_tokenizer

BLOCK = 16  # the engine's default KV block: the prefix cache's unit


def first_blocks(seed: int, tokenizer) -> set[tuple[int, ...]]:
    """The first KV block of each prompt `minivllm bench serve --seed SEED` sends (its
    random workload, as the check runs it)."""
    trace = build_trace("random", seed=seed, num_prompts=24, input_len=128, output_len=16,
                        max_model_len=4096)
    prompts, _ = asyncio.run(build_prompts(trace, tokenizer, seed=seed))
    return {tuple(p[:BLOCK]) for p in prompts}


def test_no_run_resends_a_prompt_of_another(tmp_path):
    tokenizer = word_level_tokenizer(tmp_path, 512)
    warmup, runs = served_runs(0, [0.9, 1.15], repeats=3)
    assert [r.factor for r in runs] == [0.9] * 3 + [1.15] * 3
    seeds = [warmup] + [r.seed for r in runs]
    blocks = {seed: first_blocks(seed, tokenizer) for seed in seeds}
    for a, b in combinations(seeds, 2):
        assert not blocks[a] & blocks[b], (a, b)
    # and the plan's own workload seeds (0 .. --seeds - 1 in the simulator) stay apart too
    assert not set(seeds) & set(range(10))
