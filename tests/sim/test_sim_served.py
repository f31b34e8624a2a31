"""The served path priced (sim/served_overhead.py): a profile's "served" terms add to each
request's TTFT and each step's time exactly as stated, lower the plan, and are refused when
malformed; `sim calibrate --served` measures them against a real `minivllm serve` (e2e)."""

from __future__ import annotations

import json

import pytest

from minivllm.cli import main
from minivllm.sim.profile import ProfileCostModel
from minivllm.sim.served_overhead import ServedCostModel, ServedOverhead, fit_step_overhead
from tests.sim.test_sim_plan import write_profile

SERVED = {"request_in_s": 0.004, "first_token_out_s": 0.011, "step_scale": 1.5,
          "token_s": 0.0005, "measured": "test"}


def with_served(tmp_path, served: dict | None = SERVED):
    path = write_profile(tmp_path)
    doc = json.loads(path.read_text())
    if served is not None:
        doc["served"] = served
    out = tmp_path / ("served.json" if served is not None else "plain.json")
    out.write_text(json.dumps(doc))
    return out


def test_the_step_terms_come_from_two_runs():
    # served = 1.5 x simulated + 0.5 ms a sampled sequence, at 1 and at 16 a step
    lone, batched = (1.5 * 0.037 + 0.0005, 0.037), (1.5 * 0.042 + 16 * 0.0005, 0.042)
    assert fit_step_overhead(lone, batched, 16) == pytest.approx((1.5, 0.0005))
    # the server no slower than the core: nothing added
    assert fit_step_overhead((0.030, 0.037), (0.030, 0.042), 16) == (1.0, 0.0)
    # slower in proportion only (a negative per-token term clamped): the scale alone
    scale, token_s = fit_step_overhead((0.080, 0.040), (0.090, 0.050), 16)
    assert token_s == 0.0 and scale == pytest.approx(170 / 90)


def run_sim(tmp_path, profile, name: str, concurrency: int) -> dict:
    out = tmp_path / name
    assert main(["sim", "serve", "--cost-model", f"profile:{profile}", "--workload", "random",
                 "--num-prompts", "6", "--input-len", "100", "--output-len", "20",
                 "--max-concurrency", str(concurrency), "--ignore-eos", "--disable-tqdm",
                 "--output", str(out)]) == 0
    return json.loads((out / "run.json").read_text())


def test_a_served_profile_adds_its_terms_to_each_request(tmp_path):
    plain = ProfileCostModel.load(with_served(tmp_path, None))
    served = ProfileCostModel.load(with_served(tmp_path))
    assert isinstance(served, ServedCostModel) and served.served == ServedOverhead(**SERVED)
    assert not isinstance(plain, ServedCostModel)
    base = run_sim(tmp_path, with_served(tmp_path, None), "plain", 1)
    more = run_sim(tmp_path, with_served(tmp_path), "served", 1)
    for row, ref in zip(more["requests"], base["requests"], strict=True):
        # one at a time: no queue, so the request terms add as they are, and each step
        # (one sampled sequence) takes 1.5x the core's + 0.5 ms: its prefill, 19 decodes
        def served(seconds, steps):
            return 1.5 * seconds + steps * 0.0005

        assert row["ttft"] == pytest.approx(served(ref["ttft"], 1) + 0.004 + 0.011)
        assert row["tpot_ms"] == pytest.approx(served(ref["tpot_ms"] / 1e3, 1) * 1e3)
        assert row["e2e"] == pytest.approx(served(ref["e2e"], 20) + 0.004 + 0.011)


def test_a_served_profile_plans_a_lower_rate(tmp_path):
    rates = {}
    for name, served in (("plain", None), ("served", SERVED)):
        out = tmp_path / f"plan-{name}"
        assert main(["sim", "plan", "--cost-model", f"profile:{with_served(tmp_path, served)}",
                     "--workload", "random", "--num-prompts", "60", "--input-len", "200",
                     "--output-len", "16", "--seeds", "2", "--slo-ttft-p99-ms", "400",
                     "--slo-tpot-p50-ms", "60", "--disable-tqdm", "--output", str(out)]) == 0
        doc = json.loads((out / "plan.json").read_text())
        rates[name] = doc["max_request_rate"]
        assert ("served" in doc["cost_model"]) == (served is not None)
    assert rates["served"] < rates["plain"]


@pytest.mark.parametrize("served, message", [
    ({**SERVED, "token_s": -1}, "served token_s must be a number >= 0"),
    ({"request_in_s": 0.1}, "'served' must hold request_in_s"),
])
def test_malformed_served_terms_are_named(tmp_path, served, message):
    with pytest.raises(ValueError, match=message):
        ProfileCostModel.load(with_served(tmp_path, served))


def test_served_needs_a_profile(capsys):
    assert main(["sim", "calibrate", "--model", "x", "--operators", "--served"]) == 2
    assert "drop --operators" in capsys.readouterr().err


@pytest.mark.e2e
def test_calibrate_served_measures_a_real_server(tmp_path, tiny_llama):
    out = tmp_path / "profile.json"
    assert main(["sim", "calibrate", "--model", str(tiny_llama), "--quick", "--served",
                 "--num-threads", "1", "--output", str(out)]) == 0
    served = ProfileCostModel.load(out).served
    # the tiny model's HTTP, tokenization and streaming: more than nothing, under a second
    assert 0 < served.request_in_s < 1 and 0 < served.first_token_out_s < 1
    assert served.step_scale >= 1 and served.token_s >= 0
    assert "one at a time" in served.measured and "16 at once" in served.measured
