"""Workload generators: the seed report's scenarios and the random workload, statistically."""

import numpy as np
import pytest

from minivllm.bench.traces import build_trace
from minivllm.bench.workload import (
    SCENARIOS,
    draw_priority,
    fit_context,
    random_trace,
    resolve_length_scale,
    seed_trace,
)

SEEDS = range(100)


@pytest.mark.parametrize("name", ["low", "medium", "high"])
def test_seed_scenario_statistics(name):
    cfg = SCENARIOS[name]
    totals, gaps, lengths = [], [], []
    for seed in SEEDS:
        trace = seed_trace(name, seed=seed)
        entries = trace.entries
        totals.append(len(entries))
        assert [e.send_time for e in entries] == sorted(e.send_time for e in entries)
        assert {e.user for e in entries} <= set(range(1, cfg.user_count + 1))
        for user in {e.user for e in entries}:
            times = [0.0] + [e.send_time for e in entries if e.user == user]
            gaps += np.diff(times).tolist()
        lengths += [e.prompt_tokens for e in entries]
    # Poisson(lambda_requests) per user
    assert np.mean(totals) == pytest.approx(cfg.user_count * cfg.lambda_requests, rel=0.05)
    # exponential gaps at lambda_frequency per user
    assert np.mean(gaps) == pytest.approx(1 / cfg.lambda_frequency, rel=0.05)
    assert np.std(gaps) == pytest.approx(1 / cfg.lambda_frequency, rel=0.1)
    # the mixture: each length sits near one class mean (Poisson), in the configured proportions
    lambdas = np.asarray(cfg.length_lambdas)
    lengths = np.asarray(lengths)
    cls = np.abs(lengths[:, None] - lambdas[None, :]).argmin(axis=1)
    for k, (weight, lam) in enumerate(zip(cfg.weights, lambdas, strict=True)):
        assert np.mean(cls == k) == pytest.approx(weight, abs=0.03)
        assert lengths[cls == k].mean() == pytest.approx(lam, rel=0.02)
        assert lengths[cls == k].var() == pytest.approx(lam, rel=0.3)  # Poisson: var == mean


def test_medium_has_the_codes_twelve_users():
    assert SCENARIOS["medium"].user_count == 12


def test_traces_are_seeded():
    a, b = seed_trace("high", seed=3), seed_trace("high", seed=3)
    assert a.entries == b.entries
    assert seed_trace("high", seed=4).entries != a.entries


def test_length_scale_output_split_and_context_cap():
    assert resolve_length_scale("auto", 2048) == 1 / 16
    assert resolve_length_scale("auto", 512) == 1 / 64
    assert resolve_length_scale("0.5", 512) == 0.5
    with pytest.raises(ValueError):
        resolve_length_scale("0", 512)
    full = seed_trace("high", seed=1)
    scaled = seed_trace("high", seed=1, length_scale=1 / 16, max_model_len=2048)
    assert scaled.buckets == (500 / 16, 5000 / 16)
    assert scaled.num_capped == 0
    for f, s in zip(full.entries, scaled.entries, strict=True):
        assert (f.send_time, f.user) == (s.send_time, s.user)
        assert s.prompt_tokens == max(1, round(f.prompt_tokens / 16))
        assert s.output_tokens == min(128, max(2, round(s.prompt_tokens * 0.25)))
        assert s.prompt_tokens + s.output_tokens <= 2048
    tight = seed_trace("high", seed=1, length_scale=1 / 16, max_model_len=256)
    assert tight.num_capped > 0
    assert all(e.prompt_tokens + e.output_tokens <= 256 for e in tight.entries)
    assert fit_context(300, 100, 256) == (156, 100, True)
    assert fit_context(10, 4, None) == (10, 4, False)


def test_build_trace_auto_scale_and_num_prompts():
    trace = build_trace("seed-high", seed=0, max_model_len=512, num_prompts=25)
    assert trace.length_scale == 1 / 64
    assert len(trace.entries) == 25
    full = build_trace("seed-high", seed=0, max_model_len=512)
    assert trace.entries == full.entries[:25]
    assert max(e.prompt_tokens + e.output_tokens for e in full.entries) <= 512
    with pytest.raises(ValueError):
        build_trace("seed-huge")


def test_priorities():
    buckets = (31.25, 312.5)
    assert [draw_priority("user", u, 10, buckets) for u in (1, 2, 3, 4)] == [0, 1, 2, 0]
    assert [draw_priority("length", 1, n, buckets) for n in (31, 32, 312, 313)] == [0, 1, 1, 2]
    assert draw_priority("none", 1, 10, buckets) is None
    trace = seed_trace("high", seed=0, length_scale=1 / 16, priority="length")
    assert {e.priority for e in trace.entries} == {0, 1, 2}
    assert all(e.priority is None for e in seed_trace("low").entries)


def test_random_workload_poisson_and_burstiness():
    n = 4000
    for shape in (0.25, 1.0, 4.0):
        trace = random_trace(n, 100, 20, request_rate=10.0, burstiness=shape, seed=5)
        times = np.array([e.send_time for e in trace.entries])
        assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
        gaps = np.diff(times)
        assert gaps.mean() == pytest.approx(0.1, rel=0.1)
        assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(shape), rel=0.1)
        assert {(e.prompt_tokens, e.output_tokens) for e in trace.entries} == {(100, 20)}
    burst = random_trace(10, 100, 20)
    assert all(e.send_time == 0.0 for e in burst.entries)
    capped = random_trace(3, 500, 100, max_model_len=512)
    assert capped.num_capped == 3 and capped.entries[0].prompt_tokens == 412
    with pytest.raises(ValueError):
        random_trace(3, 10, 10, burstiness=0)
