"""AsyncLLM over the in-process client (the engine core's busy loop on a thread), and the
stat loggers, against a fake engine core and a fake clock: no model."""

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
from minivllm.core.scheduler_stats import SchedulerStats
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.errors import (
    EngineDeadError,
    EngineOverloadedError,
    RequestFailedError,
    RequestTimeoutError,
)
from minivllm.engine.inproc_client import InprocClient
from minivllm.engine.messages import EngineCoreOutput, EngineCoreOutputs
from minivllm.engine.metrics_table import token_buckets
from minivllm.engine.stat_loggers import LoggingStatLogger, PrometheusStatLogger
from minivllm.engine.stats import FinishedRequestStats, IterationStats
from minivllm.entrypoints.openai.api_server import build_app
from minivllm.sampling_params import SamplingParams


class FakeTokenizer:
    """Every text is token 1; every token reads "x"."""

    chat_template = None

    def __call__(self, text):
        return SimpleNamespace(input_ids=[1])

    def __len__(self):
        return 100

    def encode(self, text, add_special_tokens=True):
        return [1]

    def decode(self, ids, skip_special_tokens=False):
        return "x" * len(ids)


class FakeCore:
    """EngineCore's interface: each step adds token 7 to every running request."""

    def __init__(self, max_model_len: int = 100_000) -> None:
        self.max_model_len = max_model_len
        self.requests: dict[str, list] = {}  # id -> [params, tokens]
        self.aborted: list[str] = []
        self.stopped: list[str] = []  # aborted because a stop string ended them
        self.fail_step = False
        self.fail_request: str | None = None
        self.time_out_request: str | None = None  # failed before it was ever scheduled
        self.thread_ids: set[int] = set()

    def _touch(self) -> None:
        self.thread_ids.add(threading.get_ident())

    def add_request(self, request) -> None:
        self._touch()
        max_tokens = request.sampling_params.max_tokens
        if max_tokens is not None and max_tokens > self.max_model_len:
            raise ValueError(f"max_tokens {max_tokens} > {self.max_model_len}")
        self.requests[request.request_id] = [request.sampling_params, []]

    def abort_requests(self, ids, stopped=False) -> None:
        self._touch()
        for request_id in ids:
            if self.requests.pop(request_id, None) is not None:
                (self.stopped if stopped else self.aborted).append(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> EngineCoreOutputs:
        self._touch()
        time.sleep(0.001)  # a forward pass takes time
        if self.fail_step:
            raise RuntimeError("boom")
        outputs = []
        for request_id, (params, tokens) in list(self.requests.items()):
            if request_id == self.time_out_request:
                del self.requests[request_id]
                outputs.append(EngineCoreOutput(request_id, finish_reason="abort",
                                                error="waited too long", error_kind="timeout"))
                continue
            if request_id == self.fail_request:
                del self.requests[request_id]
                outputs.append(EngineCoreOutput(request_id, finish_reason="abort",
                                                error="bad request", error_kind="failed",
                                                first_scheduled_time=time.time()))
                continue
            tokens.append(7)
            done = len(tokens) >= params.max_tokens
            if done:
                del self.requests[request_id]
            outputs.append(EngineCoreOutput(request_id, new_token_ids=[7],
                                            finish_reason="length" if done else None,
                                            first_scheduled_time=time.time()))
        return EngineCoreOutputs(timestamp=time.time(), outputs=outputs,
                                 scheduler_stats=self.get_stats())

    def get_stats(self) -> SchedulerStats:
        return SchedulerStats(num_running=len(self.requests))

    def set_tracing(self, enabled, interval) -> None:
        pass

    def take_trace(self, now, force=False):
        return None


def make_engine(core: FakeCore, stat_loggers=(), log_interval: float = 0.05) -> AsyncLLM:
    return AsyncLLM(InprocClient(None, core=core), EngineConfig(), list(stat_loggers),
                    log_interval, tokenizer=FakeTokenizer())


@pytest.fixture
def fake():
    core = FakeCore()
    engine = make_engine(core)
    yield core, engine
    engine.shutdown()


async def collect(engine, request_id, max_tokens=5, **params):
    return [out async for out in engine.generate(
        None, SamplingParams(max_tokens=max_tokens, **params), request_id,
        prompt_token_ids=[1])]


def test_streams_outputs_with_the_core_on_its_thread(fake):
    core, engine = fake

    async def main():
        return await asyncio.gather(*(collect(engine, f"r{i}", 3 + i) for i in range(4)))

    results = asyncio.run(main())
    for i, outputs in enumerate(results):
        assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) == 3 + i
        assert not any(out.finished for out in outputs[:-1])
    assert core.thread_ids == {engine._client._thread.ident}  # one owner thread


def test_a_stop_string_stops_the_request_in_the_core(fake):
    """The OutputProcessor ends the sequence at the stop string; the core, which sees no
    text, must be told (frontend.process_outputs), or it generates to max_tokens."""
    core, engine = fake
    outputs = asyncio.run(collect(engine, "r", max_tokens=10_000, stop=["xxx"]))
    assert outputs[-1].outputs[0].finish_reason == "stop"
    deadline = time.monotonic() + 5
    while not core.stopped and time.monotonic() < deadline:  # the core thread gets to it
        time.sleep(0.01)
    assert core.stopped == ["r"] and not core.requests


def test_a_request_the_core_rejects_raises_value_error(fake):
    _, engine = fake
    with pytest.raises(ValueError, match="max_tokens 200000 > 100000"):
        asyncio.run(collect(engine, "r", max_tokens=200_000))
    assert engine.is_running


def test_consumer_leaving_aborts_the_request(fake):
    core, engine = fake

    async def leave_early():
        async for _ in engine.generate(None, SamplingParams(max_tokens=10_000), "r",
                                       prompt_token_ids=[1]):
            break  # closing the generator aborts

    asyncio.run(leave_early())
    for _ in range(100):
        if core.aborted:
            break
        threading.Event().wait(0.01)
    assert core.aborted == ["r"] and not core.requests


def test_cancelled_consumer_aborts_the_request(fake):
    core, engine = fake

    async def cancel_it():
        task = asyncio.ensure_future(collect(engine, "r", max_tokens=10_000))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for _ in range(500):  # the engine thread applies the abort when it gets to it
            if core.aborted:
                break
            await asyncio.sleep(0.01)

    asyncio.run(cancel_it())
    assert core.aborted == ["r"]


def test_one_failed_request_does_not_stop_the_others(fake):
    core, engine = fake
    core.fail_request = "bad"

    async def main():
        return await asyncio.gather(collect(engine, "bad"), collect(engine, "good"),
                                    return_exceptions=True)

    bad, good = asyncio.run(main())
    assert isinstance(bad, RequestFailedError) and "bad request" in str(bad)
    assert not isinstance(bad, RequestTimeoutError)
    assert good[-1].finished and engine.is_running


def test_a_request_failed_unscheduled_timed_out_and_is_counted():
    core = FakeCore()
    prometheus = PrometheusStatLogger("m", max_model_len=512)
    engine = make_engine(core, [prometheus], log_interval=60)
    core.time_out_request = "late"
    try:
        with pytest.raises(RequestTimeoutError, match="waited too long"):
            asyncio.run(collect(engine, "late"))
    finally:
        engine.shutdown()
    assert _sample(prometheus.registry, "vllm:num_requests_rejected_total",
                   reason="request_timeout") == 1
    assert _sample(prometheus.registry, "vllm:num_requests_rejected_total",
                   reason="shutdown") == 0


def test_drain_refuses_new_requests_then_cuts_the_stragglers():
    core = FakeCore()
    prometheus = PrometheusStatLogger("m", max_model_len=512)
    engine = make_engine(core, [prometheus], log_interval=60)

    async def main():
        short = asyncio.ensure_future(collect(engine, "short", max_tokens=20))
        long = asyncio.ensure_future(collect(engine, "long", max_tokens=50_000))
        await asyncio.sleep(0.02)
        drain = asyncio.ensure_future(engine.drain(timeout=2.0))  # ample for short
        await asyncio.sleep(0.01)
        with pytest.raises(EngineOverloadedError, match="shutting down") as refused:
            await collect(engine, "late")
        assert refused.value.reason == "shutdown"
        cut = await drain
        return cut, await short, await asyncio.gather(long, return_exceptions=True)

    cut, short, (long,) = asyncio.run(main())
    assert cut == 1 and short[-1].finished
    assert isinstance(long, EngineDeadError) and "shut down before" in str(long)
    assert engine.errored and not engine.crashed
    assert not engine._client._thread.is_alive()  # the core's loop has stopped
    assert _sample(prometheus.registry, "vllm:num_requests_rejected_total",
                   reason="shutdown") == 1


def test_step_exception_fails_requests_and_marks_the_engine_dead(fake, caplog):
    core, engine = fake

    async def main():
        task = asyncio.ensure_future(collect(engine, "r", max_tokens=10_000))
        await asyncio.sleep(0.05)
        core.fail_step = True
        with pytest.raises(EngineDeadError, match="boom"):
            await task
        with pytest.raises(EngineDeadError):
            await collect(engine, "later")
        app = build_app(engine, SimpleNamespace())
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return await http.get("/health")

    with caplog.at_level(logging.ERROR):
        health = asyncio.run(main())
    assert engine.errored and engine.crashed and not engine.is_running
    assert "Traceback" in caplog.text or any(r.exc_info for r in caplog.records)
    assert health.status_code == 503 and "boom" in health.json()["error"]["message"]


def test_every_client_has_the_protocols_methods():
    from minivllm.distributed.data_parallel import DataParallelClient
    from minivllm.engine.core_client import EngineCoreClient
    from minivllm.engine.mp_client import MPClient

    methods = [name for name in vars(EngineCoreClient) if not name.startswith("_")]
    assert "get_outputs" in methods and "replica_states" in methods
    for client in (InprocClient, MPClient, DataParallelClient):
        missing = [name for name in methods if not callable(getattr(client, name, None))]
        assert not missing, (client.__name__, missing)


def test_logging_stat_logger_line_and_quiet_when_idle(caplog):
    now = [100.0]
    stat_logger = LoggingStatLogger(clock=lambda: now[0])
    busy = SchedulerStats(num_running=3, num_waiting=2, num_swapped=1, kv_cache_usage=0.256,
                          prefix_cache_queries=200, prefix_cache_hits=50)
    stat_logger.record(busy, IterationStats(0, num_prompt_tokens=120, num_generation_tokens=30))
    stat_logger.record(busy, IterationStats(0, num_prompt_tokens=0, num_generation_tokens=20))
    now[0] += 5.0
    with caplog.at_level(logging.INFO, logger="minivllm.engine.stat_loggers"):
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
