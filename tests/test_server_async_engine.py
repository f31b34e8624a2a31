"""AsyncLLMEngine and the stat loggers, against a fake engine and a fake clock: no model."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client import generate_latest

from minivllm.config import EngineConfig
from minivllm.engine.async_engine import AsyncLLMEngine
from minivllm.engine.errors import (
    EngineDeadError,
    EngineOverloadedError,
    RequestFailedError,
    RequestTimeoutError,
)
from minivllm.engine.metrics import LoggingStatLogger, PrometheusStatLogger, token_buckets
from minivllm.engine.stats import FinishedRequestStats, IterationStats, SchedulerStats
from minivllm.entrypoints.openai.api_server import build_app
from minivllm.outputs import CompletionOutput, RequestMetrics, RequestOutput
from minivllm.sampling_params import SamplingParams


class FakeEngine:
    """LLMEngine's interface: each step adds token 7 to every running request."""

    def __init__(self, max_model_len: int = 100_000) -> None:
        self.config = EngineConfig()
        self.tokenizer = SimpleNamespace(chat_template=None)
        self.max_model_len = max_model_len
        self.requests: dict[str, list] = {}  # id -> [params, tokens]
        self.finished_outside_step: list[RequestOutput] = []
        self.aborted: list[str] = []
        self.stat_loggers: list = []
        self.fail_step = False
        self.fail_request: str | None = None
        self.time_out_request: str | None = None  # failed before it was ever scheduled
        self.thread_ids: set[int] = set()

    def _touch(self) -> None:
        self.thread_ids.add(threading.get_ident())

    def add_request(self, request_id, prompt, params, prompt_token_ids=None, priority=0,
                    arrival_time=None, cache_salt=None, oracle_output_len=None, user=None,
                    ttft_slo_ms=None, e2e_slo_ms=None):
        self._touch()
        if params.max_tokens is not None and params.max_tokens > self.max_model_len:
            raise ValueError(f"max_tokens {params.max_tokens} > {self.max_model_len}")
        self.requests[request_id] = [params, []]

    def abort_request(self, request_id):
        self._touch()
        params, tokens = self.requests.pop(request_id)
        self.aborted.append(request_id)
        self.finished_outside_step.append(self._output(request_id, tokens, "abort"))

    def has_unfinished_requests(self):
        return bool(self.requests or self.finished_outside_step)

    def step(self):
        self._touch()
        time.sleep(0.001)  # a forward pass takes time
        if self.fail_step:
            raise RuntimeError("boom")
        outputs, self.finished_outside_step = self.finished_outside_step, []
        for request_id, (params, tokens) in list(self.requests.items()):
            tokens.append(7)
            done = len(tokens) >= params.max_tokens
            error = "bad request" if request_id == self.fail_request else None
            if request_id == self.time_out_request:
                del self.requests[request_id]
                outputs.append(self._output(request_id, [], "abort", "waited too long",
                                            RequestMetrics(arrival_time=0.0)))
                continue
            if done or error:
                del self.requests[request_id]
            outputs.append(self._output(request_id, tokens, "length" if done or error else None,
                                        error))
        for stat_logger in self.stat_loggers:
            stat_logger.record(self.get_stats(), IterationStats(timestamp=0.0))
        return outputs

    @staticmethod
    def _output(request_id, tokens, finish_reason, error=None, metrics=None):
        completion = CompletionOutput(0, "x" * len(tokens), list(tokens), None, None,
                                      finish_reason)
        return RequestOutput(request_id, None, [1], None, [completion],
                             finished=finish_reason is not None, metrics=metrics, error=error)

    def get_stats(self):
        return SchedulerStats(num_running=len(self.requests))

    def add_stat_logger(self, stat_logger):
        self.stat_loggers.append(stat_logger)


@pytest.fixture
def fake():
    engine = FakeEngine()
    async_engine = AsyncLLMEngine(engine, log_interval=0.05)
    yield engine, async_engine
    async_engine.shutdown()


async def collect(async_engine, request_id, max_tokens=5):
    return [out async for out in async_engine.generate(
        None, SamplingParams(max_tokens=max_tokens), request_id, prompt_token_ids=[1])]


def test_streams_outputs_on_the_engine_thread(fake):
    engine, async_engine = fake

    async def main():
        return await asyncio.gather(*(collect(async_engine, f"r{i}", 3 + i) for i in range(4)))

    results = asyncio.run(main())
    for i, outputs in enumerate(results):
        assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) == 3 + i
        assert not any(out.finished for out in outputs[:-1])
    assert engine.thread_ids == {async_engine._thread.ident}  # one owner thread


def test_add_request_value_error_reaches_the_caller(fake):
    _, async_engine = fake
    with pytest.raises(ValueError, match="max_tokens 200000 > 100000"):
        asyncio.run(collect(async_engine, "r", max_tokens=200_000))
    assert async_engine.is_running


def test_consumer_leaving_aborts_the_request(fake):
    engine, async_engine = fake

    async def leave_early():
        async for _ in async_engine.generate(None, SamplingParams(max_tokens=10_000), "r",
                                             prompt_token_ids=[1]):
            break  # closing the generator aborts

    asyncio.run(leave_early())
    for _ in range(100):
        if engine.aborted:
            break
        threading.Event().wait(0.01)
    assert engine.aborted == ["r"] and not engine.requests


def test_cancelled_consumer_aborts_the_request(fake):
    engine, async_engine = fake

    async def cancel_it():
        task = asyncio.ensure_future(collect(async_engine, "r", max_tokens=10_000))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for _ in range(500):  # the engine thread applies the abort when it gets to it
            if engine.aborted:
                break
            await asyncio.sleep(0.01)

    asyncio.run(cancel_it())
    assert engine.aborted == ["r"]


def test_one_failed_request_does_not_stop_the_others(fake):
    engine, async_engine = fake
    engine.fail_request = "bad"

    async def main():
        return await asyncio.gather(collect(async_engine, "bad"), collect(async_engine, "good"),
                                    return_exceptions=True)

    bad, good = asyncio.run(main())
    assert isinstance(bad, RequestFailedError) and "bad request" in str(bad)
    assert good[-1].finished and async_engine.is_running


def test_a_request_failed_unscheduled_timed_out_and_is_counted():
    engine = FakeEngine()
    prometheus = PrometheusStatLogger("m", max_model_len=512)
    async_engine = AsyncLLMEngine(engine, [prometheus], log_interval=60)
    engine.time_out_request = "late"
    try:
        with pytest.raises(RequestTimeoutError, match="waited too long"):
            asyncio.run(collect(async_engine, "late"))
    finally:
        async_engine.shutdown()
    assert _sample(prometheus.registry, "vllm:num_requests_rejected_total",
                   reason="request_timeout") == 1
    assert _sample(prometheus.registry, "vllm:num_requests_rejected_total",
                   reason="shutdown") == 0


def test_drain_refuses_new_requests_then_cuts_the_stragglers():
    engine = FakeEngine()
    prometheus = PrometheusStatLogger("m", max_model_len=512)
    async_engine = AsyncLLMEngine(engine, [prometheus], log_interval=60)

    async def main():
        short = asyncio.ensure_future(collect(async_engine, "short", max_tokens=20))
        long = asyncio.ensure_future(collect(async_engine, "long", max_tokens=50_000))
        await asyncio.sleep(0.02)
        drain = asyncio.ensure_future(async_engine.drain(timeout=2.0))  # ample for short
        await asyncio.sleep(0.01)
        with pytest.raises(EngineOverloadedError, match="shutting down") as refused:
            await collect(async_engine, "late")
        assert refused.value.reason == "shutdown"
        cut = await drain
        return cut, await short, await asyncio.gather(long, return_exceptions=True)

    cut, short, (long,) = asyncio.run(main())
    assert cut == 1 and short[-1].finished
    assert isinstance(long, EngineDeadError) and "shut down before" in str(long)
    assert async_engine.errored and not async_engine.crashed
    assert _sample(prometheus.registry, "vllm:num_requests_rejected_total",
                   reason="shutdown") == 1


def test_step_exception_fails_requests_and_marks_the_engine_dead(fake, caplog):
    engine, async_engine = fake

    async def main():
        task = asyncio.ensure_future(collect(async_engine, "r", max_tokens=10_000))
        await asyncio.sleep(0.05)
        engine.fail_step = True
        with pytest.raises(EngineDeadError, match="boom"):
            await task
        with pytest.raises(EngineDeadError):
            await collect(async_engine, "later")
        app = build_app(async_engine, SimpleNamespace())
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return await http.get("/health")

    with caplog.at_level(logging.ERROR):
        health = asyncio.run(main())
    assert async_engine.errored and async_engine.crashed and not async_engine.is_running
    assert "Traceback" in caplog.text or any(r.exc_info for r in caplog.records)
    assert health.status_code == 503 and "boom" in health.json()["error"]["message"]


def test_logging_stat_logger_line_and_quiet_when_idle(caplog):
    now = [100.0]
    stat_logger = LoggingStatLogger(clock=lambda: now[0])
    busy = SchedulerStats(num_running=3, num_waiting=2, num_swapped=1, kv_cache_usage=0.256,
                          prefix_cache_queries=200, prefix_cache_hits=50)
    stat_logger.record(busy, IterationStats(0, num_prompt_tokens=120, num_generation_tokens=30))
    stat_logger.record(busy, IterationStats(0, num_prompt_tokens=0, num_generation_tokens=20))
    now[0] += 5.0
    with caplog.at_level(logging.INFO, logger="minivllm.engine.metrics"):
        stat_logger.log()
        stat_logger.record(SchedulerStats(), IterationStats(0))
        for _ in range(3):  # one line showing the zeros, then silence
            now[0] += 5.0
            stat_logger.log()
    assert caplog.messages == [
        "Avg prompt throughput: 24.0 tokens/s, Avg generation throughput: 10.0 tokens/s, "
        "Running: 3 reqs, Swapped: 1 reqs, Waiting: 2 reqs, KV cache usage: 25.6%, "
        "Prefix cache hit rate: 25.0%",
        "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, "
        "Running: 0 reqs, Swapped: 0 reqs, Waiting: 0 reqs, KV cache usage: 0.0%, "
        "Prefix cache hit rate: 0.0%",
    ]


def _sample(registry, name, **labels):
    return registry.get_sample_value(name, {"model_name": "m", **labels})


def test_prometheus_counters_equal_the_engine_counts():
    p = PrometheusStatLogger("m", max_model_len=512)
    finished = FinishedRequestStats("length", 10, 4, e2e_latency=1.5, queue_time=0.25,
                                    prefill_time=0.5, decode_time=0.75)
    p.record(SchedulerStats(num_running=2, num_waiting=1, kv_cache_usage=0.5,
                            prefix_cache_queries=100, prefix_cache_hits=40, num_preemptions=1),
             IterationStats(0, num_prompt_tokens=60, num_generation_tokens=2,
                            time_to_first_tokens=[0.2, 0.3]))
    p.record(SchedulerStats(num_running=0, kv_cache_usage=0.0, prefix_cache_queries=130,
                            prefix_cache_hits=40, num_preemptions=3, num_total_swap_blocks=8,
                            num_free_swap_blocks=6),
             IterationStats(0, num_generation_tokens=3, inter_token_latencies=[0.01],
                            finished_requests=[finished]))
    r = p.registry
    assert _sample(r, "vllm:prefix_cache_queries_total") == 130
    assert _sample(r, "vllm:prefix_cache_hits_total") == 40
    assert _sample(r, "vllm:num_preemptions_total") == 3
    assert _sample(r, "vllm:prompt_tokens_total") == 60
    assert _sample(r, "vllm:generation_tokens_total") == 5
    assert _sample(r, "vllm:num_requests_running") == 0
    assert _sample(r, "vllm:kv_cache_usage_perc") == 0
    assert _sample(r, "vllm:cpu_cache_usage_perc") == 0.25
    p.record_rejected("max_num_waiting_requests")
    assert _sample(r, "vllm:num_requests_rejected_total",
                   reason="max_num_waiting_requests") == 1
    assert _sample(r, "vllm:request_success_total", finished_reason="length") == 1
    assert _sample(r, "vllm:request_success_total", finished_reason="abort") == 0
    assert _sample(r, "vllm:time_to_first_token_seconds_count") == 2
    assert _sample(r, "vllm:time_to_first_token_seconds_sum") == pytest.approx(0.5)
    assert _sample(r, "vllm:e2e_request_latency_seconds_sum") == 1.5
    assert _sample(r, "vllm:request_queue_time_seconds_sum") == 0.25
    assert _sample(r, "vllm:request_prefill_time_seconds_sum") == 0.5
    assert _sample(r, "vllm:request_decode_time_seconds_sum") == 0.75
    assert _sample(r, "vllm:inter_token_latency_seconds_count") == 1
    assert _sample(r, "vllm:request_prompt_tokens_sum") == 10
    assert _sample(r, "vllm:request_generation_tokens_sum") == 4
    text = generate_latest(r).decode()
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_swapped",
                 "vllm:request_success_total"):
        assert f'{name}{{' in text
    assert token_buckets(512) == [1, 2, 5, 10, 20, 50, 100, 200, 500]
