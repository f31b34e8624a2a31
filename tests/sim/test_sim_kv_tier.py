"""The simulator's disk tier of the prefix cache (sim/disk_tier.py) and the KV cache dtype as
cost-model terms: hits after memory evicts, the LRU bound, a warm restart against a cold one,
the blocks a quantized cache holds, and the disk transfers priced in step time."""

from __future__ import annotations

import pytest

from minivllm.bench.workload import Trace, TraceEntry
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.step_batch import StepBatch
from minivllm.sim.cost_model import CostModel
from minivllm.sim.disk_tier import SimDiskTier
from minivllm.sim.kv_bytes import QUANTIZED_KV_DTYPES
from minivllm.sim.profile import ProfileCostModel
from minivllm.sim.roofline import roofline_from_preset
from minivllm.sim.simulator import Simulator

BLOCK = 4


class RecordingCost(CostModel):
    """1 ms a step and a token, plus the disk's transfers (0.1 ms a token), each step's
    batch kept."""

    name = "recording"
    kv_bytes_per_token = 1000
    disk_read_bandwidth = disk_write_bandwidth = 1e7

    def __init__(self) -> None:
        self.batches: list[StepBatch] = []

    def step_time(self, b: StepBatch) -> float:
        self.batches.append(b)
        return 1e-3 * (1 + b.num_tokens) + self.disk_time(b)


def tight(num_blocks: int = 6) -> SchedulerConfig:
    return SchedulerConfig(num_blocks=num_blocks, block_size=BLOCK, max_num_batched_tokens=64,
                           max_model_len=64)


def prefix_trace() -> tuple[Trace, list[list[int]]]:
    """A prompt of 3 blocks and a token, three others that take every block of the cache
    (evicting it), then the first prompt again: one request at a time."""
    shared = list(range(3 * BLOCK + 1))
    others = [list(range(1000 * k, 1000 * k + 5 * BLOCK)) for k in (1, 2, 3)]
    prompts = [shared, *others, shared]
    entries = [TraceEntry(10.0 * i, 1, len(p), 2) for i, p in enumerate(prompts)]
    return Trace("prefix", entries), prompts


def simulate(disk_tier_bytes: int | None, **kwargs):
    trace, prompts = prefix_trace()
    cost = RecordingCost()
    result = Simulator(tight(), "fcfs", cost, disk_tier_bytes=disk_tier_bytes,
                       **kwargs).run(trace, prompts)
    return result, cost


def test_the_tier_serves_a_prefix_memory_evicted():
    without, _ = simulate(None)
    with_tier, _ = simulate(1 << 30)
    assert without.stats.scheduler.kv_disk_hits == 0
    assert with_tier.stats.scheduler.kv_disk_hits == 3 * BLOCK  # the repeat's three blocks
    assert (with_tier.stats.scheduler.num_computed_tokens
            == without.stats.scheduler.num_computed_tokens - 3 * BLOCK)
    assert with_tier.stats.scheduler.kv_disk_bytes_read == 3 * BLOCK * 1000


def test_the_tier_keeps_the_least_recently_used_out_beyond_its_capacity():
    tier = SimDiskTier(capacity_bytes=3 * 100, block_bytes=100)
    assert tier.write([(0, b"a"), (1, b"b"), (2, b"c")]) == 3
    assert tier.stage(b"a")  # read: now the most recently used
    tier.load([(b"a", 0)])
    assert tier.write([(3, b"d")]) == 1
    assert list(tier.index) == [b"c", b"a", b"d"]  # "b" went first
    assert tier.evictions == 1 and tier.used == 300 <= tier.capacity
    assert not tier.stage(b"b")
    assert tier.write([(4, b"c")]) == 0  # there already: only the most recently used now
    assert list(tier.index) == [b"a", b"d", b"c"]
    assert tier.bytes_written == 400 and tier.bytes_read == 100
    assert SimDiskTier(50, 100).write([(0, b"a")]) == 0  # a block it cannot hold


def test_a_warm_restart_computes_fewer_prompt_tokens_than_a_cold_one():
    warm, _ = simulate(1 << 30, warm_restart=1.0)
    cold = warm.cold
    assert warm.stats.scheduler.kv_disk_hits > cold.stats.scheduler.kv_disk_hits
    assert warm.stats.scheduler.num_computed_tokens < cold.stats.scheduler.num_computed_tokens
    first_ttft = lambda result: result.results[0].ttft  # noqa: E731
    assert first_ttft(warm) < first_ttft(cold)  # its prefix loaded, not computed
    # restarting after 3 of the 5 requests, the last 2 run after it
    late, _ = simulate(1 << 30, warm_restart=0.6)
    assert len(late.results) == len(late.cold.results) == 2
    assert late.stats.scheduler.kv_disk_hits > late.cold.stats.scheduler.kv_disk_hits


def test_an_int8_cache_holds_more_blocks_than_bf16_in_the_same_memory():
    bf16 = roofline_from_preset("a100-80g")
    int8 = roofline_from_preset("a100-80g", kv_cache_dtype="int8")
    # model/runner.py's _kv_bytes: a byte a value and an fp32 scale per token and KV head
    assert bf16.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2
    assert int8.kv_bytes_per_token == 2 * (28 * 4 * 128 + 28 * 4 * 4)
    assert int8.num_kv_blocks(16) > 1.9 * bf16.num_kv_blocks(16)
    decode = StepBatch(num_decode_seqs=64, decode_context=64 * 8000)
    assert int8.step_time(decode) < bf16.step_time(decode)  # half the KV bytes read
    engine = {"num_kv_blocks": 1000, "block_size": 16, "kv_bytes_per_token": 57344,
              "kv_shape": [28, 4, 128, 2]}
    coefficients = {"step": 1e-3, "decode_context": 1e-6}
    profiled = ProfileCostModel(coefficients, engine)
    quantized = ProfileCostModel(coefficients, engine, kv_cache_dtype="int8")
    assert quantized.num_kv_blocks(16) == 1000 * 16 * 57344 // (16 * 29568)
    assert quantized.step_time(decode) - 1e-3 == pytest.approx(
        (profiled.step_time(decode) - 1e-3) * 29568 / 57344)
    with pytest.raises(ValueError, match="records no KV shape"):
        ProfileCostModel(coefficients, {**engine, "kv_shape": None}, kv_cache_dtype="int8")


def test_the_simulator_knows_the_engines_quantized_formats():
    from minivllm.model import kv_quant

    assert set(QUANTIZED_KV_DTYPES) == set(kv_quant.FORMATS)


def test_disk_loads_and_writes_are_priced_in_step_time():
    result, cost = simulate(1 << 30)
    # The request arrives and is admitted in one step: its prefetch had no time, so the
    # step reads its 3 blocks. The writer keeps up with the writes: no step waits for them.
    loading = [b for b in cost.batches if b.num_disk_load_tokens]
    assert [b.num_disk_load_tokens for b in loading] == [3 * BLOCK]
    assert result.stats.scheduler.kv_disk_bytes_written > 0
    assert sum(b.num_disk_write_tokens for b in cost.batches) == 0
    load = StepBatch(num_disk_load_tokens=16, num_disk_write_tokens=32)
    assert cost.disk_time(load) == pytest.approx((16 + 32) * 1000 / 1e7)
    roofline = roofline_from_preset("h100-80g")
    assert roofline.step_time(load) - roofline.step_time(StepBatch()) == pytest.approx(
        roofline.kv_bytes_per_token * (16 / roofline.disk_read_bandwidth
                                       + 32 / roofline.disk_write_bandwidth))


def test_a_block_prefetched_in_an_earlier_step_costs_no_read():
    tier = SimDiskTier(1 << 20, 1000)
    tier.write([(0, b"a"), (1, b"b")])
    tier.prefetch([b"a", b"b"])
    assert tier.stage(b"a") and tier.load([(b"a", 0)]) == 1  # asked for in this very step
    tier.prefetch([b"a"])
    assert tier.load([]) == 0  # a step passes: the prefetch thread reads meanwhile
    assert tier.stage(b"a") and tier.load([(b"a", 0)]) == 0
    assert tier.bytes_read == 2000  # read either way, by the step or the prefetcher


def test_a_step_waits_only_for_writes_past_the_writers_queue():
    from minivllm.model.kv_disk_format import WRITE_QUEUE_BYTES

    block = WRITE_QUEUE_BYTES // 2
    tier = SimDiskTier(1 << 40, block)
    assert tier.write_stall_bytes(2, now=0.0, write_rate=1e6) == 0  # the queue holds two
    assert tier.write_stall_bytes(1, now=0.0, write_rate=1e6) == block  # a third waits
    later = 3 * block / 1e6  # the writer has drained them all
    assert tier.write_stall_bytes(1, now=later, write_rate=1e6) == 0


@pytest.mark.parametrize("flags, message", [
    (["--kv-offloading-size", "8"], "--kv-offloading-size: only with --kv-offloading-backend"),
    (["--kv-offloading-warm-restart", "0.5"], "--kv-offloading-warm-restart: only with"),
    (["--kv-offloading-backend", "disk", "--kv-offloading-size", "-1"],
     "--kv-offloading-size must be > 0"),
    (["--kv-offloading-backend", "s3"], "must be 'disk'"),
    (["--kv-offloading-backend", "disk", "--kv-offloading-warm-restart", "1.5"],
     "in \\(0, 1\\], got 1.5"),
])
def test_bad_disk_tier_flags_are_refused_by_name(flags, message):
    from minivllm.cli import build_parser
    from minivllm.sim.cli_setup import disk_tier_bytes

    args = build_parser().parse_args(["sim", "serve", *flags])
    with pytest.raises(SystemExit, match=message):
        disk_tier_bytes(args)


def test_sim_serve_reports_a_warm_restart(tmp_path, capsys):
    import json

    from minivllm.cli import main

    assert main(["sim", "serve", "--preset", "h100-80g", "--workload", "seed-low",
                 "--num-prompts", "6", "--kv-cache-dtype", "int8", "--kv-offloading-backend",
                 "disk", "--kv-offloading-size", "1", "--kv-offloading-warm-restart", "1",
                 "--output", str(tmp_path), "--disable-tqdm"]) == 0
    assert "warm restart:" in capsys.readouterr().out
    summary = json.loads((tmp_path / "run.json").read_text())["summary"]
    assert set(summary["warm_restart"]) == {"cold", "warm", "computed_tokens_saved"}
    assert summary["engine"]["kv_disk_hit_tokens"] == summary["warm_restart"]["warm"][
        "kv_disk_hit_tokens"]
