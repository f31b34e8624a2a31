"""Prefill/decode disaggregation in the simulator (sim/disaggregated.py, sim/kv_link.py):
timings checked by hand with a fake cost model, the link's queue, back-pressure on the
decode side, decode steps that a long prompt no longer stalls, and the commands
(`sim serve --prefill-instances P --decode-instances D`, `sim plan --disaggregated`)."""

from __future__ import annotations

import json

import pytest

from minivllm.bench.workload import Trace, TraceEntry
from minivllm.cli import main
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.step_batch import StepBatch
from minivllm.sim.cost_model import CostModel
from minivllm.sim.disaggregated import DisaggregatedSimulator
from minivllm.sim.kv_link import KVLink
from minivllm.sim.plan import Probe
from minivllm.sim.plan_disaggregated import compare_splits, fewest_for_target
from minivllm.sim.simulator import Simulator


class FakeCost(CostModel):
    """1 s a step, 0.1 s a prompt token, and the received blocks' copy (disk_time): by hand.
    1000 KV bytes a token: a block of 4 tokens is 4000 bytes, 2 s on a 2000 B/s link."""

    name = "fake"
    kv_bytes_per_token = 1000

    def step_time(self, b: StepBatch) -> float:
        return 1.0 + 0.1 * b.num_prefill_tokens + self.disk_time(b)


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{"num_blocks": 100, "block_size": 4, "max_num_batched_tokens": 64,
                              "max_model_len": 64, **kw})


def simulate(entries, prefill=1, decode=1, bandwidth=2000.0, **kw):
    sim = DisaggregatedSimulator(kw.pop("cfg", config()), "fcfs", FakeCost(),
                                 prefill_instances=prefill, decode_instances=decode,
                                 transfer_bandwidth=bandwidth, **kw)
    return sim.run(Trace("hand", entries))


def test_one_request_by_hand():
    r = simulate([TraceEntry(0.0, 1, 10, 3)], transfer_latency_s=0.5)
    res = r.results[0]
    # prefill side: 10 prompt tokens, 1 + 1.0 s: the first token at 2.0
    assert res.ttft == pytest.approx(2.0)
    # its 2 full blocks (8 tokens, 8000 bytes) cross the link: 4 s + 0.5 s, there at 6.5;
    # the decode step loads them (8000 bytes at the link's rate: 4 s) and computes the other
    # 2 prompt tokens and the first output token: 1 + 0.3 + 4 = 5.3, the second token at
    # 11.8; then one decode step of 1 s
    assert res.itl == pytest.approx([9.8, 1.0])
    assert res.e2e == pytest.approx(12.8) and res.output_tokens == 3 and res.success
    d = r.disaggregated
    assert d["transfers"] == 1 and d["bytes"] == 8000 and d["received_tokens"] == 8
    assert d["transfer_ms"]["mean"] == pytest.approx(4500.0)
    assert r.stats.scheduler.num_computed_tokens == 10 + 3 + 1  # the 8 received are not


def test_the_link_carries_one_transfer_at_a_time():
    r = simulate([TraceEntry(0.0, 1, 8, 2), TraceEntry(0.0, 2, 8, 2)])
    # both prompts in one prefill step (1 + 1.6 s); 8000 bytes each: 4 s, then 4 s more
    assert [x.ttft for x in r.results] == pytest.approx([2.6, 2.6])
    assert r.disaggregated["transfer_ms"]["mean"] == pytest.approx(6000.0)
    assert r.disaggregated["transfer_ms"]["p99"] == pytest.approx(8000.0)
    link = KVLink(2000.0)
    assert link.send(0.0, 8000) == 4.0 and link.send(1.0, 8000) == 8.0
    assert link.queued_s == 3.0


def test_a_single_output_token_ends_on_the_prefill_side():
    r = simulate([TraceEntry(0.0, 1, 10, 1)])
    res = r.results[0]
    assert res.success and res.output_tokens == 1 and res.e2e == res.ttft == 2.0
    assert r.disaggregated["transfers"] == 0


def test_a_long_prompt_never_stalls_decode_steps():
    """The point of disaggregation: colocated, a long prompt arriving while another request
    decodes shares its steps; disaggregated, the decode steps are decode only."""
    entries = [TraceEntry(0.0, 1, 4, 12), TraceEntry(5.0, 2, 40, 2)]
    colocated = Simulator(config(), "fcfs", FakeCost()).run(Trace("hand", entries))
    split = simulate(entries, bandwidth=1e9)
    assert max(colocated.results[0].itl) >= 1.0 + 0.1 * 40  # a step with the long prompt
    # after its own load, 1 s steps: the long request's first decode step on that side
    # shares one, with its 40 received tokens' copy (4e-5 s at 1 GB/s) and no prompt
    assert len(split.results[0].itl) == 11 and max(split.results[0].itl[1:]) < 1.001
    assert all(x.success for x in split.results)


def test_back_pressure_holds_transfers_until_the_decode_side_has_blocks():
    """8 blocks of 4 tokens: a transferred request (16 prompt tokens and the first output)
    takes 5 at admission, so the decode side holds the second in its queue until the first
    ends; nothing is dropped or preempted."""
    entries = [TraceEntry(0.0, 1, 16, 8), TraceEntry(0.0, 2, 16, 8)]
    r = simulate(entries, cfg=config(num_blocks=8), bandwidth=1e9)
    first, second = r.results
    assert first.success and second.success
    assert first.output_tokens == second.output_tokens == 8
    assert second.ttft + second.itl[0] >= first.e2e  # its decode began when the first ended
    assert r.stats.scheduler.num_preemptions_recompute == 0 and r.stats.peak_num_waiting == 1


def test_eos_ends_the_decode_side_at_the_trace_length():
    r = simulate([TraceEntry(0.0, 1, 10, 4)], request_max_tokens="context")
    assert r.results[0].output_tokens == 4 and r.results[0].success


@pytest.mark.parametrize("kw, message", [
    ({"prefill": 0}, ">= 1 prefill and >= 1 decode"),
    ({"bandwidth": 0.0}, "bandwidth > 0"),
    ({"cfg": config(enable_prefix_caching=False)}, "through their prefix cache"),
])
def test_bad_settings_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        simulate([TraceEntry(0.0, 1, 10, 3)], **kw)


def capacity_probe(capacity):
    """A probe met while the rate is within the split's (or colocated's) capacity."""
    def probe(rate, total, split):
        return Probe(rate, total, None, None, 1.0, 1, 0, 0, rate <= capacity(total, split))
    return probe


def test_the_split_with_the_highest_rate_is_the_answer():
    capacity = capacity_probe(lambda total, split: 2.0 * total if split is None
                              else {(1, 2): 9.0, (2, 1): 5.0}[split])
    answer, probes = compare_splits(capacity, 3, 1.0, 0.02)
    assert (answer["best"]["prefill"], answer["best"]["decode"]) == (1, 2)
    assert 9.0 / 1.02 <= answer["best"]["max_request_rate"] <= 9.0
    assert answer["colocated"]["per_instance"] == pytest.approx(
        answer["colocated"]["max_request_rate"] / 3)
    assert answer["disaggregated_over_colocated"] == pytest.approx(1.5, rel=0.03)


def test_the_fewest_instances_for_a_target_rate():
    per_decode = capacity_probe(lambda total, split: 3.0 * min(split[0], 2 * split[1]))
    answer, probes = fewest_for_target(per_decode, 7.0, 6)
    # 2: 1P+1D 3.0; 3: 1P+2D 3.0, 2P+1D 6.0; 4: 1P+3D 3.0, 2P+2D 6.0, 3P+1D 6.0;
    # 5: 1P+4D, 2P+3D, 3P+2D 9.0
    assert (answer["instances"], answer["prefill"], answer["decode"]) == (5, 3, 2)
    missed = fewest_for_target(per_decode, 100.0, 3)[0]
    assert missed["instances"] is None and missed["tried_up_to"] == 3


def write_profile(tmp_path):
    """10 ms a step, 0.1 ms a prompt token, 1 ms a decoding sequence, 4 KiB of KV a token."""
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({
        "kind": "profile",
        "coefficients": {"step": 0.01, "num_prefill_tokens": 1e-4, "num_decode_seqs": 1e-3},
        "engine": {"num_kv_blocks": 2000, "block_size": 16, "max_model_len": 1024,
                   "kv_bytes_per_token": 4096}}))
    return path


WORKLOAD = ["--workload", "random", "--num-prompts", "40", "--input-len", "200",
            "--output-len", "16", "--disable-tqdm"]


def test_sim_serve_reports_the_transfers(tmp_path, capsys):
    out = tmp_path / "serve"
    assert main(["sim", "serve", "--cost-model", f"profile:{write_profile(tmp_path)}",
                 *WORKLOAD, "--request-rate", "5", "--prefill-instances", "1",
                 "--decode-instances", "2", "--kv-transfer-gbps", "2", "--output",
                 str(out)]) == 0
    summary = json.loads((out / "run.json").read_text())["summary"]
    d = summary["engine"]["disaggregated"]
    assert d["prefill_instances"] == 1 and d["decode_instances"] == 2
    assert d["transfers"] == 40 and d["bandwidth_gbps"] == 2.0
    assert sum(d["routed_decode"]) == 40 and summary["completed"] == 40
    assert "1 prefill + 2 decode instances: 40 KV transfers" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--prefill-instances", "1"], "needs both --prefill-instances and --decode-instances"),
    (["--prefill-instances", "1", "--decode-instances", "1", "--data-parallel-size", "2"],
     "--data-parallel-size: not with --prefill-instances"),
    (["--prefill-instances", "1", "--decode-instances", "1", "--kv-transfer-gbps", "0"],
     "--kv-transfer-gbps must be > 0"),
])
def test_sim_serve_refuses_what_it_cannot_model(tmp_path, capsys, flags, message):
    assert main(["sim", "serve", "--cost-model", f"profile:{write_profile(tmp_path)}",
                 *WORKLOAD, "--request-rate", "5", *flags, "--output",
                 str(tmp_path / "bad")]) == 2
    assert message in capsys.readouterr().err


def test_sim_plan_disaggregated_writes_the_splits(tmp_path, capsys):
    out = tmp_path / "plan"
    assert main(["sim", "plan", "--cost-model", f"profile:{write_profile(tmp_path)}",
                 *WORKLOAD, "--slo-ttft-p99-ms", "100", "--slo-tpot-p50-ms", "60",
                 "--seeds", "1", "--disaggregated", "--instances", "3", "--output",
                 str(out)]) == 0
    doc = json.loads((out / "plan.json").read_text())["disaggregated"]
    assert [(s["prefill"], s["decode"]) for s in doc["splits"]] == [(1, 2), (2, 1)]
    assert all(s["max_request_rate"] > 0 for s in doc["splits"])
    assert doc["colocated"]["replicas"] == 3 and doc["colocated"]["max_request_rate"] > 0
    assert doc["best"] in doc["splits"] and doc["kv_transfer_gbps"] == 25.0
    printed = capsys.readouterr().out
    assert "best split of 3:" in printed and "3 colocated:" in printed
    assert main(["sim", "plan", "--cost-model", f"profile:{write_profile(tmp_path)}",
                 *WORKLOAD, "--slo-ttft-p99-ms", "400", "--instances", "3", "--output",
                 str(tmp_path / "bad")]) == 2
    assert "--instances: only with --disaggregated" in capsys.readouterr().err
