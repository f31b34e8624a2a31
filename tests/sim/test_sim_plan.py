"""`minivllm sim plan`: the search (against a known boundary), and the command on a synthetic
profile whose step time rises with the work (so the SLOs fail above some rate)."""

from __future__ import annotations

import json
import math

import pytest

from minivllm.cli import main
from minivllm.sim.plan import SLO, PlanError, Probe, max_rate


def boundary_probe(boundary: float, calls: list):
    def probe(rate: float) -> Probe:
        calls.append(rate)
        return Probe(rate, 1, None, None, 1.0, 1, 0, 0, rate <= boundary)
    return probe


@pytest.mark.parametrize("boundary, start", [(3.7, 1.0), (3.7, 100.0), (0.011, 1.0),
                                             (1.0, 1.0)])
def test_the_search_lands_within_the_tolerance_below_the_boundary(boundary, start):
    calls = []
    best, probes = max_rate(boundary_probe(boundary, calls), start, tolerance=0.02)
    assert boundary / 1.02 <= best <= boundary
    assert len(calls) == len(set(calls)) == len(probes)  # no rate simulated twice
    failed = [p.rate for p in probes if not p.met]
    assert min(failed) <= best * 1.02  # the bracket it stopped on
    again = max_rate(boundary_probe(boundary, []), start, tolerance=0.02)[0]
    assert again == best


def test_the_search_answers_zero_or_refuses_an_unloadable_workload():
    assert max_rate(boundary_probe(0.0, []), 1.0)[0] == 0.0
    with pytest.raises(PlanError, match="every rate"):
        max_rate(boundary_probe(math.inf, []), 1.0)


def test_an_slo_is_required_and_positive():
    with pytest.raises(ValueError, match="give an SLO"):
        SLO()
    with pytest.raises(ValueError, match="must be > 0"):
        SLO(ttft_p99_ms=-1)


def write_profile(tmp_path):
    """10 ms a step, 0.1 ms a prompt token, 1 ms a decoding sequence: monotone in the work."""
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({
        "kind": "profile",
        "coefficients": {"step": 0.01, "num_prefill_tokens": 1e-4, "num_decode_seqs": 1e-3},
        "engine": {"num_kv_blocks": 2000, "block_size": 16, "max_model_len": 1024}}))
    return path


def plan(tmp_path, name, *flags):
    out = tmp_path / name
    code = main(["sim", "plan", "--cost-model", f"profile:{write_profile(tmp_path)}",
                 "--workload", "random", "--num-prompts", "60", "--input-len", "200",
                 "--output-len", "16", "--disable-tqdm", "--output", str(out), *flags])
    doc = json.loads((out / "plan.json").read_text()) if (out / "plan.json").exists() else None
    return code, doc


def test_plan_json_and_a_tighter_slo_gives_a_lower_rate(tmp_path):
    code, loose = plan(tmp_path, "loose", "--slo-ttft-p99-ms", "400", "--slo-tpot-p50-ms", "60")
    assert code == 0
    code, tight = plan(tmp_path, "tight", "--slo-ttft-p99-ms", "60", "--slo-tpot-p50-ms", "60")
    assert code == 0
    for doc in (loose, tight):
        assert doc["max_request_rate"] > 0 and doc["policy"] == "fcfs"
        assert doc["slo"] == {"ttft_p99_ms": doc["slo"]["ttft_p99_ms"], "tpot_p50_ms": 60.0,
                              "min_goodput_ratio": None}
        best = doc["max_request_rate"]
        at_best = [p for p in doc["probes"] if p["rate"] == best]
        assert at_best and at_best[0]["met"]
        assert at_best[0]["ttft_p99_ms"] <= doc["slo"]["ttft_p99_ms"]
        assert at_best[0]["tpot_p50_ms"] <= 60.0
        # the bracket: a rate within the tolerance above the answer missed the SLOs
        assert any(not p["met"] and best < p["rate"] <= best * 1.02 + 1e-12
                   for p in doc["probes"])
        assert all(p["met"] == (p["ttft_p99_ms"] <= doc["slo"]["ttft_p99_ms"]
                                and p["tpot_p50_ms"] <= 60.0) for p in doc["probes"])
    assert tight["max_request_rate"] < loose["max_request_rate"]
    again = plan(tmp_path, "again", "--slo-ttft-p99-ms", "60", "--slo-tpot-p50-ms", "60")[1]
    assert again["max_request_rate"] == tight["max_request_rate"]  # seeded: deterministic


def test_target_rate_gives_the_replicas_and_checks_them(tmp_path):
    code, doc = plan(tmp_path, "target", "--slo-ttft-p99-ms", "400", "--slo-tpot-p50-ms", "60",
                     "--target-rate", "50")
    assert code == 0
    assert doc["replicas_estimate"] == math.ceil(50 / doc["max_request_rate"])
    assert doc["replicas"] == doc["replicas_estimate"]
    check = doc["replica_checks"][-1]
    assert check["replicas"] == doc["replicas"] and check["rate"] == 50 and check["met"]


@pytest.mark.parametrize("flags, message", [
    ([], "give an SLO"),
    (["--slo-ttft-p99-ms", "100", "--target-rate", "-3"], "--target-rate must be a positive"),
    (["--slo-ttft-p99-ms", "100", "--policy", "nope"], "unknown policy 'nope'"),
    (["--slo-ttft-p99-ms", "100", "--request-rate", "4"], "drop --request-rate"),
])
def test_bad_input_is_a_usage_error(tmp_path, capsys, flags, message):
    code, doc = plan(tmp_path, "bad", *flags)
    assert code == 2 and doc is None
    assert message in capsys.readouterr().err


def test_a_missing_profile_is_a_usage_error(tmp_path, capsys):
    assert main(["sim", "plan", "--cost-model", f"profile:{tmp_path}/none.json",
                 "--slo-ttft-p99-ms", "100", "--output", str(tmp_path)]) == 2
    assert "cannot read a profile" in capsys.readouterr().err
