"""The simulator: exact event-loop timings with a fake cost model, the same scheduling
decisions as the real engine on a seeded trace, Mooncake prefix hits, and the CLI's reports."""

from __future__ import annotations

import json

import numpy as np
import pytest

from minivllm.bench.traces import trace_from_file
from minivllm.bench.workload import Trace, TraceEntry, seed_trace
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.step_batch import StepBatch
from minivllm.sim.cost_model import CostModel
from minivllm.sim.simulator import Simulator, decision


class FakeCost(CostModel):
    """1 s a step plus 0.1 s a prefill token: easy to follow by hand."""

    name = "fake"

    def step_time(self, b: StepBatch) -> float:
        return 1.0 + 0.1 * b.num_prefill_tokens


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{"num_blocks": 100, "block_size": 4, "max_num_batched_tokens": 8,
                              "max_model_len": 64, **kw})


def test_event_loop_timings_by_hand():
    trace = Trace("hand", [TraceEntry(0.0, 1, 10, 3), TraceEntry(2.5, 2, 3, 2),
                           TraceEntry(10.0, 3, 1, 2)])
    result = Simulator(config(), "fcfs", FakeCost(), record_decisions=True).run(trace)
    # t=0: request 0 prefills 8 tokens (1.8 s), then its last 2 (1.2 s): first token at 3.0.
    # Request 1 arrived at 2.5 during that step, so it joins at 3.0: 0 decodes and 1
    # prefills 3 tokens (1.3 s, t=4.3), then both decode (1 s, t=5.3) and finish.
    # Idle until request 2 arrives at 10: its 1-token prompt is one decode-sized step (t=11),
    # its second token at t=12.
    assert result.decisions == [((("0", 8),), (), 0, 0), ((("0", 2),), (), 0, 0),
                                ((("0", 1), ("1", 3)), (), 0, 0),
                                ((("0", 1), ("1", 1)), (), 0, 0),
                                ((("2", 1),), (), 0, 0), ((("2", 1),), (), 0, 0)]
    r0, r1, r2 = result.results
    assert (r0.ttft, *r0.itl, r0.e2e, r0.output_tokens) == pytest.approx((3.0, 1.3, 1.0, 5.3, 3))
    assert (r1.ttft, *r1.itl, r1.e2e) == pytest.approx((1.8, 1.0, 2.8))
    assert (r2.ttft, r2.e2e) == pytest.approx((1.0, 2.0))
    assert all(r.success for r in result.results)
    assert result.stats.simulated_wall_time_s == pytest.approx(12.0)
    assert result.stats.num_steps == 6


def test_preemption_by_recompute_is_timed_and_counted():
    # 4 blocks of 4 tokens: two requests of 6 + 4 tokens cannot both finish; the later
    # arrival is preempted (recompute), then recomputes its prompt and its first output.
    trace = Trace("tight", [TraceEntry(0.0, 1, 6, 4), TraceEntry(0.0, 2, 6, 4)])
    result = Simulator(config(num_blocks=4), "fcfs", FakeCost(), record_decisions=True).run(trace)
    assert result.stats.scheduler.num_preemptions_recompute >= 1
    assert result.stats.scheduler.num_preemptions_swap == 0
    assert all(r.success and r.output_tokens == 4 for r in result.results)
    assert result.stats.peak_kv_usage == 1.0
    preempted = [d for d in result.decisions if d[1]]
    assert preempted and all(d[1] == ("1",) for d in preempted)


def test_a_request_that_never_fits_fails_like_a_400():
    trace = Trace("big", [TraceEntry(0.0, 1, 200, 2), TraceEntry(1.0, 2, 4, 2)])
    result = Simulator(config(num_blocks=10, max_model_len=1000), "fcfs", FakeCost()).run(trace)
    assert not result.results[0].success and "exceeds the whole KV cache" in result.results[0].error
    assert result.results[1].success and result.results[1].ttft == pytest.approx(1.0 + 0.4)


@pytest.mark.parametrize("policy", ["fcfs", "priority", "sjf"])
def test_engine_and_simulator_make_the_same_decisions(tiny_llama, policy):
    """The real EngineCore (tiny model, real runner) on a virtual clock advanced by the same
    deterministic cost: every step's (request, tokens) list, preemptions and swaps match."""
    from minivllm.config import EngineConfig
    from minivllm.core.step_batch import step_batch
    from minivllm.engine.core import EngineCore
    from minivllm.engine.messages import EngineCoreRequest
    from minivllm.sampling_params import SamplingParams

    trace = seed_trace("high", seed=3, length_scale=1 / 256, max_model_len=128,
                       priority="length", num_prompts=40)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(5, 200, e.prompt_tokens).tolist() for e in trace.entries]
    core = EngineCore(EngineConfig(model=str(tiny_llama), num_kv_blocks=40, block_size=4,
                                   max_num_batched_tokens=32, max_model_len=128,
                                   scheduling_policy=policy, active_preemption=True,
                                   min_run_quantum=2, swap_space=0.001, seed=0))
    now, decisions, cost = [0.0], [], FakeCost()
    sched = core.scheduler
    sched.clock = lambda: now[0]
    schedule = sched.schedule

    def timed_schedule():
        out = schedule()
        if out.num_scheduled_tokens:
            decisions.append(decision(out))
            now[0] += cost.step_time(step_batch(out, sched.requests, sched.config.block_size))
        return out

    sched.schedule = timed_schedule
    pending = list(enumerate(trace.entries))
    while pending or core.has_unfinished_requests():
        while pending and pending[0][1].send_time <= now[0]:
            i, e = pending.pop(0)
            core.add_request(EngineCoreRequest(
                str(i), prompts[i], SamplingParams(max_tokens=e.output_tokens, ignore_eos=True,
                                                   temperature=0),
                e.send_time, e.priority if policy == "priority" else 0))
        if core.has_unfinished_requests():
            core.step()
        else:
            now[0] = pending[0][1].send_time
    sim = Simulator(sched.config, policy, cost, send_priority=policy == "priority",
                    record_decisions=True).run(trace, prompts)
    assert len(decisions) > 50 and any(d[1] for d in decisions)  # preemptions happened
    assert sim.decisions == decisions


def test_mooncake_hash_ids_hit_the_prefix_cache(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1536, "output_length": 2, "hash_ids": [1, 2, 3]},
            {"timestamp": 10000, "input_length": 1536, "output_length": 2, "hash_ids": [1, 2, 4]},
            {"timestamp": 20000, "input_length": 1100, "output_length": 2, "hash_ids": [1, 2, 5]},
            {"timestamp": 30000, "input_length": 1536, "output_length": 2, "hash_ids": [6, 7, 8]}]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = trace_from_file(f"mooncake:{path}", length_scale=1 / 32)  # 16-token blocks
    result = Simulator(config(block_size=16, max_num_batched_tokens=64), "fcfs",
                       FakeCost()).run(trace)
    # Requests 1 and 2 find ids 1 and 2 (32 tokens each) and compute only the rest (16 and
    # 2 of 48 and 34 tokens: 1.6 and 0.2 s of prefill); request 3 shares nothing.
    assert result.stats.scheduler.prefix_cache_queries == 48 + 48 + 34 + 48
    assert result.stats.scheduler.prefix_cache_hits == 64
    assert [r.ttft for r in result.results] == pytest.approx([1 + 4.8, 1 + 1.6, 1 + 0.2, 1 + 4.8])


def test_sim_policies_cli_writes_the_bench_reports(tmp_path):
    from minivllm.cli import main

    out = tmp_path / "pol"
    assert main(["sim", "policies", "--preset", "rtx4090-qwen2.5-7b", "--workload", "seed-high",
                 "--num-prompts", "6", "--policies", "fcfs,sjf", "--active-preemption",
                 "--output", str(out), "--disable-tqdm"]) == 0
    text = (out / "comparison.md").read_text()
    assert "simulated, roofline:rtx4090-qwen2.5-7b" in text
    assert "### Engine side (simulated)" in text and "Beside the seed report's section 3.2" in text
    run = json.loads((out / "sjf" / "run.json").read_text())
    assert run["meta"]["simulated"] == "simulated, roofline:rtx4090-qwen2.5-7b"
    engine = run["summary"]["engine"]
    assert engine["simulated_wall_time_s"] > 0 and set(engine["preemptions"]) == {"swap", "recompute"}
    assert len(run["requests"]) == 6
    for name in ("summary.md", "ttft_cdf.png", "buckets.png"):
        assert (out / "fcfs" / name).exists()
    assert (out / "comparison_buckets.png").exists()


def test_sim_rejects_a_bad_cost_model(tmp_path, capsys):
    from minivllm.cli import main

    for flags, match in ((["--cost-model", "magic"], "roofline:PRESET, profile:PATH or operators:PATH"),
                         (["--preset", "tpu"], "unknown roofline preset"),
                         (["--cost-model", f"profile:{tmp_path}/none.json"], "cannot read")):
        assert main(["sim", "serve", *flags, "--output", str(tmp_path)]) == 2
        assert match in capsys.readouterr().err


def test_calibrate_writes_a_profile_the_simulator_loads(tiny_llama, tmp_path):
    from minivllm.cli import main
    from minivllm.sim.profile import ProfileCostModel

    path = tmp_path / "profile.json"
    assert main(["sim", "calibrate", "--model", str(tiny_llama), "--quick",
                 "--output", str(path)]) == 0
    profile = ProfileCostModel.load(path)
    assert profile.coefficients["step"] > 0 and all(v >= 0 for v in profile.coefficients.values())
    assert profile.fit_error["num_steps"] > 20
    assert profile.step_time(StepBatch(num_decode_seqs=4, decode_context=100)) > 0
    assert main(["sim", "serve", "--cost-model", f"profile:{path}", "--workload", "seed-low",
                 "--num-prompts", "6", "--output", str(tmp_path / "run"), "--disable-tqdm"]) == 0
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["meta"]["simulated"] == f"simulated, profile:{path}"
    assert run["meta"]["scheduler"]["num_blocks"] == profile.engine["num_kv_blocks"]


def test_profile_fit_recovers_known_coefficients():
    from minivllm.sim.profile import fit

    rng = np.random.default_rng(0)
    batches = [StepBatch(num_prefill_seqs=int(p > 0), num_prefill_tokens=int(p),
                         prefill_attention=int(p * p // 2), num_decode_seqs=int(d),
                         decode_context=int(d * c))
               for p, d, c in zip(rng.integers(0, 300, 60), rng.integers(0, 40, 60),
                                  rng.integers(10, 400, 60), strict=True)]
    true = {"step": 2e-3, "num_prefill_tokens": 5e-5, "num_decode_seqs": 1e-4,
            "decode_context": 1e-7}
    seconds = [true["step"] + true["num_prefill_tokens"] * b.num_prefill_tokens
               + true["num_decode_seqs"] * b.num_decode_seqs
               + true["decode_context"] * b.decode_context for b in batches]
    got = fit(batches, seconds)
    for name, value in true.items():
        assert got[name] == pytest.approx(value, rel=1e-6, abs=1e-12)
    assert got["prefill_attention"] == pytest.approx(0, abs=1e-12)


def test_the_simulator_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys, minivllm.sim.cli, minivllm.sim.simulator, minivllm.sim.roofline, "
            "minivllm.sim.profile; print([m for m in ('torch', 'transformers') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_max_concurrency_holds_requests_in_the_client():
    # One slot: request 1 (sent at 0.5) waits until request 0 finishes at t=2 (two 1-token
    # steps); its latencies count from then, as the bench client's do.
    trace = Trace("one-slot", [TraceEntry(0.0, 1, 1, 2), TraceEntry(0.5, 2, 1, 2)])
    result = Simulator(config(), "fcfs", FakeCost(), max_concurrency=1).run(trace)
    r0, r1 = result.results
    assert (r0.start, r0.ttft, r0.e2e) == pytest.approx((0.0, 1.0, 2.0))
    assert (r1.start, r1.ttft, r1.e2e) == pytest.approx((2.0, 1.0, 2.0))
    free = Simulator(config(), "fcfs", FakeCost()).run(trace).results[1]
    assert (free.start, free.ttft) == pytest.approx((0.5, 1.5))  # joins at the step's end, t=1
