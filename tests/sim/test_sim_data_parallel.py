"""The simulator with N replicas (sim/simulator.py's data_parallel_size) and `minivllm sim
serve --data-parallel-size N --router-policy P`: cache_aware routing turns shared prefixes
into prefix-cache hits, and more replicas serve a saturated trace sooner. (One replica is the
plain simulator by construction: the same loop, with N = 1.)"""

from __future__ import annotations

import json
import random

import pytest

from minivllm.bench.workload import Trace, TraceEntry
from minivllm.cli import main
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.step_batch import StepBatch
from minivllm.sim.cost_model import CostModel
from minivllm.sim.simulator import Simulator


class FakeCost(CostModel):
    name = "fake"

    def step_time(self, b: StepBatch) -> float:
        return 0.01 + 0.001 * b.num_prefill_tokens


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{"num_blocks": 200, "block_size": 4,
                              "max_num_batched_tokens": 64, "max_model_len": 256, **kw})


def shared_prefix_workload(num_systems: int, num_users: int, gap: float = 0.02,
                           output_tokens: int = 4, seed: int = 0):
    """num_systems system prompts of 64 tokens, each followed by one user's 8 tokens, sent
    every `gap` seconds."""
    rng = random.Random(seed)
    systems = [[1000 * s + i for i in range(64)] for s in range(num_systems)]
    entries, prompts = [], []
    for i in range(num_systems * num_users):
        prompt = systems[rng.randrange(num_systems)] + [rng.randrange(50, 900) for _ in range(8)]
        entries.append(TraceEntry(i * gap, i, len(prompt), output_tokens))
        prompts.append(prompt)
    return Trace("shared-prefix", entries), prompts


def test_cache_aware_beats_round_robin_on_shared_prefixes():
    trace, prompts = shared_prefix_workload(num_systems=8, num_users=12)
    runs = {}
    for policy in ("round_robin", "least_load", "cache_aware"):
        result = Simulator(config(), "fcfs", FakeCost(), data_parallel_size=4,
                           router_policy=policy).run(trace, prompts)
        assert all(r.success for r in result.results)
        assert sum(result.routed) == len(trace.entries) and min(result.routed) > 0
        runs[policy] = result
    rates = {p: r.stats.prefix_cache_hit_rate for p, r in runs.items()}
    print("simulated prefix-cache hit rate, 4 replicas:", rates)
    # Each system prompt misses once per replica that sees it: 8 misses at best, 32 at worst.
    assert rates["cache_aware"] > rates["round_robin"] + 0.1
    assert rates["cache_aware"] > rates["least_load"] + 0.1
    assert runs["cache_aware"].router_prefix_hit_tokens > \
        runs["round_robin"].router_prefix_hit_tokens


def test_more_replicas_serve_a_saturated_trace_sooner():
    trace, prompts = shared_prefix_workload(num_systems=2, num_users=30, gap=0.0,
                                            output_tokens=16)
    walls = [Simulator(config(max_num_seqs=4), "fcfs", FakeCost(),
                       data_parallel_size=n, router_policy="least_load")
             .run(trace, prompts).stats.simulated_wall_time_s for n in (1, 2)]
    assert walls[1] < 0.7 * walls[0]


def test_the_recompute_tax_is_summed_over_replicas():
    """Two replicas, round robin, each given the same two requests that do not fit its KV
    cache together: each recomputes what one replica alone with two requests does."""
    tight = config(num_blocks=4, max_num_batched_tokens=8, max_model_len=64,
                   enable_prefix_caching=False)

    def engine(n: int) -> dict:
        trace = Trace("tight", [TraceEntry(0.0, i, 6, 4) for i in range(2 * n)])
        return Simulator(tight, "fcfs", FakeCost(), data_parallel_size=n,
                         router_policy="round_robin").run(trace).stats.as_dict()

    one, two = engine(1), engine(2)
    assert one["recomputed_tokens"] > 0
    assert two["recomputed_tokens"] == 2 * one["recomputed_tokens"]
    assert two["computed_tokens"] == 2 * one["computed_tokens"]
    assert two["recompute_tax"] == pytest.approx(one["recompute_tax"])


def test_sim_serve_cli_with_replicas(tmp_path, capsys):
    rows = [{"timestamp": 100 * i, "input_length": 1536, "output_length": 4,
             "hash_ids": [i % 3, 10 + i % 3, 100 + i]} for i in range(24)]
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    code = main(["sim", "serve", "--workload", f"mooncake:{path}", "--preset", "h100-80g",
                 "--length-scale", str(1 / 32), "--data-parallel-size", "3",
                 "--router-policy", "cache_aware", "--output", str(out), "--disable-tqdm"])
    assert code == 0
    summary = json.loads((out / "run.json").read_text())["summary"]
    dp = summary["engine"]["data_parallel"]
    assert dp["size"] == 3 and dp["router_policy"] == "cache_aware"
    assert sum(dp["routed"]) == 24 and summary["completed"] == 24
    assert "3 replicas, router cache_aware" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["sim", "serve", "--workload", f"mooncake:{path}", "--router-policy", "nope"])
