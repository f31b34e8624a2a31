"""Output-length predictors (core/length_predictor.py) on fake requests, SJF ordering with
each, the ranking-quality figures (bench/prediction.py), and `sim policies` across
predictors. The runner's hidden state is tested in test_length_probe_runner.py."""

from __future__ import annotations

import math
import random

import pytest

from minivllm.bench.prediction import kendall_tau, quality
from minivllm.core.length_predictor import (
    LENGTH_PREDICTORS,
    BucketPredictor,
    OnlineRidge,
    RunningQuantile,
    make_length_predictor,
    prompt_bucket,
)
from minivllm.core.policy import make_policy
from minivllm.core.request import Request
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_config import SchedulerConfig


def req(rid: str, prompt_len: int = 4, max_tokens: int = 100, output: int = 0,
        oracle: int | None = None, hidden=None, arrival: float = 0.0) -> Request:
    r = Request.make(rid, list(range(prompt_len)), max_tokens, arrival, oracle_output_len=oracle)
    for t in range(output):
        r.append_output_token(t)
    r.prompt_hidden = hidden
    return r


def test_registry_names_the_known_predictors():
    assert set(LENGTH_PREDICTORS) == {"mean", "oracle", "bucket", "probe"}
    with pytest.raises(ValueError, match="bucket, mean, oracle, probe"):
        make_length_predictor("crystal-ball")
    with pytest.raises(ValueError, match="length_predictor"):
        make_policy("sjf", length_predictor="crystal-ball")


def test_mean_is_max_tokens_then_the_running_mean_clamped():
    p = make_length_predictor("mean")
    assert p.predict(req("a", max_tokens=100)) == 100
    p.observe(req("f1", output=3))
    p.observe(req("f2", output=6))
    assert p.predict(req("b", max_tokens=100)) == 4  # round(4.5) (banker's: 4)
    assert p.predict(req("c", max_tokens=2)) == 2  # clamped to max_tokens


def test_oracle_reads_the_lab_field_and_falls_back_to_mean():
    p = make_length_predictor("oracle")
    assert p.predict(req("a", oracle=17)) == 17
    assert p.predict(req("b", oracle=500, max_tokens=100)) == 100  # clamped
    assert p.predict(req("c", oracle=0)) == 1
    assert p.predict(req("d")) == 100  # no field: mean's max_tokens before any finish


def test_running_quantile_matches_numpy_and_forgets_old_values():
    np = pytest.importorskip("numpy")
    rng = random.Random(0)
    q = RunningQuantile(0.9, window=50)
    values = [rng.randint(1, 1000) for _ in range(120)]
    for v in values:
        q.add(v)
    assert len(q) == 50
    assert q.value() == pytest.approx(float(np.percentile(values[-50:], 90)))


def test_bucket_quantiles_per_prompt_length_bucket():
    p = BucketPredictor(quantile=0.5, min_samples=3)
    assert prompt_bucket(1) == 1 and prompt_bucket(7) == 3 and prompt_bucket(8) == 4
    assert p.predict(req("x", prompt_len=5)) == 100  # nothing seen: max_tokens
    for out in (10, 20, 30):  # short prompts (4-7 tokens) -> short answers
        p.observe(req("s", prompt_len=5, output=out))
    for out in (300, 400, 500):  # prompts of 64-127 tokens -> long answers
        p.observe(req("l", prompt_len=100, output=out, max_tokens=1000))
    assert p.predict(req("a", prompt_len=6)) == 20
    assert p.predict(req("b", prompt_len=70, max_tokens=1000)) == 400
    # a bucket with too few samples uses the quantile over all buckets
    p.observe(req("m", prompt_len=20, output=7))
    assert p.predict(req("c", prompt_len=20, max_tokens=1000)) == 30  # median of 7 values


def test_online_ridge_recovers_a_linear_relation():
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=8), 3.0
    ridge = OnlineRidge(alpha=1e-3)
    for _ in range(200):
        x = rng.normal(size=8) * 5 + 2
        ridge.add(x, float(x @ w + b))
    x = rng.normal(size=8)
    assert ridge.predict(x) == pytest.approx(float(x @ w + b), abs=1e-3)


def test_probe_learns_output_length_from_hidden_features():
    """Synthetic hidden states whose one direction encodes log(output length): after some
    finished requests the probe ranks new ones almost perfectly; before its prefill (no
    hidden state) a request is predicted as bucket predicts."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(1)
    direction = rng.normal(size=16)

    def hidden(length):
        return direction * math.log1p(length) + rng.normal(size=16) * 0.05

    p = make_length_predictor("probe")
    assert p.needs_hidden_state
    for i in range(60):
        n = int(rng.integers(1, 400))
        p.observe(req(f"f{i}", output=n, hidden=hidden(n), max_tokens=512))
    truth = [int(rng.integers(1, 400)) for _ in range(40)]
    preds = [p.predict(req(f"n{i}", hidden=hidden(n), max_tokens=512))
             for i, n in enumerate(truth)]
    assert kendall_tau(preds, truth) > 0.9
    assert np.mean(np.abs(np.array(preds) - truth)) < 25
    before_prefill = req("w", max_tokens=512)
    assert p.predict(before_prefill) == p.fallback.predict(before_prefill)
    assert 1 <= p.predict(req("clamp", hidden=hidden(10**6), max_tokens=50)) <= 50


def test_probe_projects_wide_hidden_states_and_refits_as_samples_grow():
    """A 3584-wide hidden state (Qwen2.5-7B's) becomes 256 features; the ridge refits when the
    samples have grown by a quarter, and still ranks by the signal."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(2)
    direction = rng.normal(size=3584)
    p = make_length_predictor("probe")
    for i in range(40):
        n = int(rng.integers(1, 400))
        p.observe(req(f"f{i}", output=n, max_tokens=512,
                      hidden=direction * math.log1p(n) + rng.normal(size=3584) * 0.1))
    assert p.ridge.sum_x.shape == (256,)
    truth = [int(rng.integers(1, 400)) for _ in range(30)]
    preds = [p.predict(req(f"n{i}", max_tokens=512,
                           hidden=direction * math.log1p(n) + rng.normal(size=3584) * 0.1))
             for i, n in enumerate(truth)]
    assert kendall_tau(preds, truth) > 0.8
    fitted = p.ridge.fitted_n
    p.observe(req("one-more", output=5, hidden=direction, max_tokens=512))
    p.predict(req("again", hidden=direction, max_tokens=512))
    assert p.ridge.fitted_n == fitted  # 41 samples: not a quarter more than 40


def test_policy_feeds_its_predictor_and_sjf_ranks_by_it():
    for name in ("fcfs", "priority", "sjf"):
        policy = make_policy(name, length_predictor="bucket")
        assert type(policy.predictor) is BucketPredictor
        policy.on_finished(req("done", output=5))
        assert len(policy.predictor.overall) == 1


@pytest.mark.parametrize("predictor, expected", [
    # mean knows nothing per request: equal prompts -> arrival order
    ("mean", ["a", "b", "c"]),
    # oracle: shortest true output first
    ("oracle", ["c", "a", "b"]),
    # bucket: 'b' has a long prompt, and long prompts were seen to answer briefly
    ("bucket", ["b", "a", "c"]),
    # probe: the hidden feature says c is short, a middling, b long
    ("probe", ["c", "a", "b"]),
])
def test_sjf_order_with_each_predictor(predictor, expected):
    np = pytest.importorskip("numpy")
    policy = make_policy("sjf", length_predictor=predictor)
    rng = np.random.default_rng(0)
    for i in range(20):  # history: 4-token prompts answered at length, 64-token ones briefly
        policy.on_finished(req(f"h{i}", prompt_len=4, output=200 + i,
                               hidden=np.array([math.log1p(200 + i), rng.normal()])))
        policy.on_finished(req(f"k{i}", prompt_len=64, output=2,
                               hidden=np.array([math.log1p(2), rng.normal()])))
    lengths = {"a": 50, "b": 90, "c": 5}
    waiting = [req(rid, prompt_len=64 if (rid, predictor) == ("b", "bucket") else 4,
                   oracle=n, arrival=i / 10, hidden=np.array([math.log1p(n), 0.0]))
               for i, (rid, n) in enumerate(lengths.items())]
    assert [r.request_id for r in policy.order(waiting, now=0.2)] == expected


def test_sjf_counts_work_left_after_prefix_cache_hits():
    """Two requests of equal prompt and predicted output: the one whose prompt the prefix
    cache already holds has less work to do, and is admitted first."""
    sched = Scheduler(SchedulerConfig(num_blocks=64, block_size=4, max_num_batched_tokens=64,
                                      max_num_seqs=1),
                      make_policy("sjf", length_predictor="oracle"), clock=lambda: 0.0)
    shared = list(range(100, 132))  # 8 blocks
    warm = Request.make("warm", shared + [1], 1, 0.0, oracle_output_len=1)
    sched.add_request(warm)
    out = sched.schedule()
    sched.update_from_output(out, {"warm": 7})
    sched.finish_request(warm, warm.status.FINISHED_LENGTH)  # its blocks stay cached
    cold = Request.make("cold", list(range(500, 532)) + [2], 5, 1.0, oracle_output_len=5)
    hit = Request.make("hit", shared + [3], 5, 2.0, oracle_output_len=5)
    sched.add_request(cold)
    sched.add_request(hit)
    policy = sched.policy
    assert policy.remaining_work(hit) < policy.remaining_work(cold)
    out = sched.schedule()
    assert list(out.num_scheduled_tokens) == ["hit"]
    assert hit.num_cached_tokens == 32


def test_scheduler_records_predictions_at_arrival_admission_and_after_prefill():
    np = pytest.importorskip("numpy")
    sched = Scheduler(SchedulerConfig(num_blocks=32, block_size=4),
                      make_policy("sjf", length_predictor="probe"), clock=lambda: 0.0)
    r = Request.make("r", [1, 2, 3, 4, 5], 50, 0.0)
    sched.add_request(r)
    assert r.predicted_output_len == 50  # bucket fallback: max_tokens before any finish
    for i in range(10):  # requests finish before r is admitted; feature 0 is their length
        sched.policy.predictor.observe(req(f"t{i}", output=i + 1,
                                           hidden=np.array([math.log1p(i + 1), 0.0])))
    out = sched.schedule()
    assert out.want_prompt_hidden
    assert r.predicted_output_len == 5.5  # at admission: bucket's median of what finished
    sched.update_from_output(out, {"r": 9}, {"r": np.array([math.log1p(4.0), 0.0])})
    assert r.prompt_hidden is not None
    assert r.predicted_output_len == pytest.approx(4.0, abs=0.5)


def test_kendall_tau_by_hand_and_by_definition():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)  # 5 C, 1 D
    assert kendall_tau([1, 1], [1, 2]) is None  # a constant side
    assert kendall_tau([5], [5]) is None
    rng = random.Random(3)
    x = [rng.randint(0, 9) for _ in range(300)]  # many ties: tau-b's correction matters
    y = [v + rng.randint(0, 6) for v in x]
    assert kendall_tau(x, y) == pytest.approx(tau_b_by_definition(x, y), abs=1e-12)
    # scipy.stats.kendalltau(x, y).statistic on these values, 2026-11-23 (scipy 1.17.1)
    assert kendall_tau(x, y) == pytest.approx(0.6547194036, abs=1e-9)


def tau_b_by_definition(x, y) -> float:
    pairs = [(i, j) for i in range(len(x)) for j in range(i + 1, len(x))]
    sign = [((x[i] > x[j]) - (x[i] < x[j])) * ((y[i] > y[j]) - (y[i] < y[j])) for i, j in pairs]
    untied_x = sum(x[i] != x[j] for i, j in pairs)
    untied_y = sum(y[i] != y[j] for i, j in pairs)
    return sum(sign) / math.sqrt(untied_x * untied_y)


def test_quality_skips_missing_predictions():
    q = quality([10, None, 30, 20], [12, 99, 25, 20])
    assert q["n"] == 3 and q["kendall_tau"] == 1.0
    assert q["mae"] == pytest.approx((2 + 5 + 0) / 3)
    assert quality([None], [1])["kendall_tau"] is None


def test_sim_policies_across_predictors_prints_the_columns(tmp_path, capsys, monkeypatch):
    from minivllm.bench import report
    from minivllm.cli import main

    def no_png(fig, path):  # plots are report.py's business, and most of the time here
        report.plt.close(fig)
        return path

    monkeypatch.setattr(report, "_save", no_png)

    out = tmp_path / "cmp"
    rc = main(["sim", "policies", "--policies", "fcfs", "sjf", "--length-predictors", "mean",
               "oracle", "bucket", "probe", "--workload", "seed-high", "--num-prompts", "40",
               "--length-scale", "0.02", "--request-max-tokens", "context", "--num-kv-blocks", "64", "--block-size", "16",
               "--max-model-len", "1024", "--max-num-seqs", "8", "--goodput", "ttft:500",
               "--disable-tqdm", "--output", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    for column in ("goodput (req/s, ttft:500)", "mean E2E (s)", "p99 TTFT (s)",
                   "short-request mean TTFT (s)", "max queue (s)", "Kendall tau",
                   "MAE (tokens)"):
        assert column in text
    for run in ("| fcfs |", "| sjf/mean |", "| sjf/oracle |", "| sjf/bucket |", "| sjf/probe |"):
        assert run in text
    assert "| fcfs/" not in text  # fcfs ignores predictions: one run
    oracle_row = next(line for line in text.splitlines() if line.startswith("| sjf/oracle |"))
    assert "| 1.000 | 0.0 |" in oracle_row  # the oracle ranks perfectly, no error


def test_bench_client_counts_an_eos_only_output():
    """Without ignore_eos a request may finish at once with EOS, which has no text: the
    finishing chunk is its first token, not a failure."""
    import asyncio
    import json as json_

    import aiohttp
    from aiohttp import web

    from minivllm.bench.client import RequestResult, send_request

    async def completions(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for obj in ({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
                    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}):
            await resp.write(f"data: {json_.dumps(obj)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def main():
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        result = RequestResult(0, 1, None, 3, 5, 0.0)
        async with aiohttp.ClientSession() as session:
            await send_request(session, f"http://127.0.0.1:{port}/v1/completions",
                               {"prompt": [1, 2, 3]}, False, result, 0.0)
        await runner.cleanup()
        return result

    result = asyncio.run(main())
    assert result.success and result.output_tokens == 1, result.error
    assert result.ttft is not None and result.e2e == result.ttft
