"""GET /v1/engine/events and GET /dashboard on a real server: behind --api-key (Bearer, or
Basic for browsers), the events' shape, a request's lifecycle in order, an abort, figures
equal to /metrics, and a disconnect that frees its stream; the hub alone with a fake engine:
tracing on with the first client and off with the last, --disable-dashboard."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from minivllm.bench.client import RequestResult
from minivllm.bench.timeline_html import client_events, record_engine_events, write_run_timeline
from minivllm.config import EngineConfig
from minivllm.core.lifecycle import LifecycleEvent, TraceSample
from minivllm.core.scheduler_stats import SchedulerStats
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.stats import IterationStats
from minivllm.entrypoints.dashboard.events import EngineEventHub
from minivllm.entrypoints.dashboard.routes import add_dashboard_routes
from minivllm.sampling_params import SamplingParams
from tests.server_utils import (
    DATA_PARALLEL,
    FAST_ENGINE_ARGS,
    SLOW_STEPS,
    ServerProcess,
    stories_model,
)

KEY = "dash-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BASIC = {"Authorization": "Basic " + base64.b64encode(f"anyone:{KEY}".encode()).decode()}
STREAMS = "minivllm:dashboard_event_streams"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard_events")
    # Slow steps: a 400-token request outlasts the client that leaves it after 0.3 s.
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, "--api-key", KEY,
                                             "--dashboard-interval", "0.2"], tmp / "server.log",
                           prelude=SLOW_STEPS)
    yield server
    server.stop()


def events(response: httpx.Response):
    """(event name, data) of a server-sent event stream."""
    name, data = None, []
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            data.append(line[len("data: "):])
        elif not line and name:
            yield name, json.loads("".join(data))
            name, data = None, []


def lifecycle_until(stream, request_id: str, last_state: str, timeout: float = 30):
    """The request's states in order, until `last_state`; and the snapshots meanwhile."""
    states, snapshots, deadline = [], [], time.monotonic() + timeout
    for name, data in stream:
        assert time.monotonic() < deadline, f"no {last_state} for {request_id}: {states}"
        if name == "snapshot":
            snapshots.append(data)
        elif name == "lifecycle":
            states += [e for e in data["events"] if e["request_id"] == request_id]
            if states and states[-1]["state"] == last_state:
                return states, snapshots
    raise AssertionError("the stream ended")


def in_background(fn) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_the_key_guards_events_and_page(server):
    for path in ("/v1/engine/events", "/dashboard", "/dashboard/static/timeline.js"):
        missing = httpx.get(server.url + path)
        assert missing.status_code == 401, path
        assert missing.headers["www-authenticate"].startswith("Basic")  # a browser prompts
        assert httpx.get(server.url + path, headers={"Authorization": "Bearer nope"}
                         ).status_code == 401
    wrong_basic = "Basic " + base64.b64encode(b"anyone:nope").decode()
    assert httpx.get(server.url + "/dashboard",
                     headers={"Authorization": wrong_basic}).status_code == 401
    page = httpx.get(server.url + "/dashboard", headers=BASIC)
    assert page.status_code == 200 and "timeline.js" in page.text
    script = httpx.get(server.url + "/dashboard/static/dashboard.js", headers=AUTH)
    assert script.status_code == 200 and "EventSource" in script.text
    assert "http" not in page.text  # everything from this server: it works offline
    # Basic is for the dashboard's paths only: the API keeps Bearer.
    assert httpx.get(server.url + "/v1/models", headers=BASIC).status_code == 401


def test_snapshots_show_where_streams_ttft_went(server):
    """A streamed request's TTFT parts (request_timing.py) reach the next snapshot; a
    snapshot with no stream's first token in its interval has none."""
    body = {"prompt": "Once upon a time", "max_tokens": 4, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("GET", server.url + "/v1/engine/events", headers=AUTH,
                      timeout=30) as response:
        stream = events(response)
        next(stream)  # config
        first = next(data for name, data in stream if name == "snapshot")
        assert first["ttft_split"] is None
        usage = {}

        def send():
            with httpx.stream("POST", server.url + "/v1/completions", json=body,
                              headers=AUTH, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {") and '"usage":{' in line:
                        usage.update(json.loads(line[len("data: "):]))

        in_background(send)
        split = next(data["ttft_split"] for _, (name, data) in zip(range(100), stream)
                     if name == "snapshot" and data["ttft_split"])
    assert split["requests"] == 1
    parts = ("frontend_in_ms", "queue_ms", "prefill_ms", "frontend_out_ms")
    assert all(split[p] >= 0 for p in parts) and split["prefill_ms"] > 0
    deadline = time.monotonic() + 30
    while "timing" not in usage:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # the same request's parts as its stream's usage chunk says
    assert sum(split[p] for p in parts) == pytest.approx(usage["timing"]["server_ttft_s"] * 1000)


def test_events_shape_and_a_request_life_in_order(server):
    done = {}
    body = {"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True,
            "temperature": 0, "user": "alice"}
    with httpx.stream("GET", server.url + "/v1/engine/events", headers=AUTH,
                      timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        stream = events(response)
        name, config = next(stream)
        assert name == "config" and config["interval"] == 0.2
        assert config["policy"]["scheduling_policy"] == "fcfs"
        assert config["engine"]["max_num_seqs"] == 8 and config["max_model_len"] > 0
        # Before any request: the core answers the dashboard with its block map all the same.
        snapshots = (data for name, data in stream if name == "snapshot")
        idle = next(s for _, s in zip(range(25), snapshots) if s["block_map"])
        assert idle["block_map"]["total"] == 128 * DATA_PARALLEL and idle["running"] == 0
        in_background(lambda: done.update(httpx.post(
            server.url + "/v1/completions", json=body, headers=AUTH, timeout=60).json()))
        deadline = time.monotonic() + 30
        while "id" not in done:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        states, snapshots = lifecycle_until(stream, done["id"] + "-0", "finished")
        # The next snapshot comes after the finish: nothing runs, as /metrics says.
        snapshot = next(data for name, data in stream if name == "snapshot")
        metrics = server.metrics(AUTH)
    assert [e["state"] for e in states] == ["queued", "prefill", "decode", "finished"]
    assert [e["t"] for e in states] == sorted(e["t"] for e in states)
    queued, prefill, _, finished = states
    assert queued["tokens"] == prefill["tokens"] == done["usage"]["prompt_tokens"]
    assert queued["priority"] == 0 and queued["user"] == "alice"
    assert finished["tokens"] == 24 and finished["reason"] == "length"

    assert snapshot["running"] == metrics["vllm:num_requests_running"] == 0
    assert snapshot["waiting"] == metrics["vllm:num_requests_waiting"] == 0
    assert snapshot["kv_cache_usage"] == metrics["vllm:kv_cache_usage_perc"]
    assert snapshot["preemptions"] == metrics["vllm:num_preemptions_total"]
    assert snapshot["prefix_cache_queries"] == metrics["vllm:prefix_cache_queries_total"]
    busy = [s for s in snapshots if s["steps"]["count"]]
    assert busy and all(0 < s["steps"]["mean_tokens"] <= s["steps"]["max_tokens"] <= 512
                        and s["steps"]["token_budget"] == 512 for s in busy)
    assert sum(s["generation_throughput"] for s in snapshots) > 0
    blocks = snapshot["block_map"]
    assert blocks["total"] == 128 * DATA_PARALLEL and blocks["in_use"] == 0  # FAST_ENGINE_ARGS
    assert blocks["in_use"] + blocks["cached"] + blocks["free"] == blocks["total"]
    assert blocks["cached"] >= 1  # the finished prompt's full blocks stay in the prefix cache
    assert set(blocks["cells"]["map"]) <= set("ucf") and len(blocks["cells"]["map"]) <= 256


def test_an_aborted_request_shows_as_aborted(server):
    first = {}
    body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True,
            "stream": True}

    def stream_then_leave():
        with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=AUTH,
                          timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    first["id"] = json.loads(line[6:])["id"]
                    time.sleep(0.3)
                    return  # leaving mid-stream aborts the request

    with httpx.stream("GET", server.url + "/v1/engine/events", headers=AUTH,
                      timeout=30) as response:
        stream = events(response)
        next(stream)
        in_background(stream_then_leave).join(timeout=60)
        states, _ = lifecycle_until(stream, first["id"] + "-0", "aborted")
    assert states[0]["state"] == "queued" and "decode" in [e["state"] for e in states]
    assert 0 < states[-1]["tokens"] < 400


def test_a_disconnect_frees_its_stream(server):
    def open_streams() -> float:
        return server.metrics().get(STREAMS, -1)

    assert open_streams() == 0
    with httpx.stream("GET", server.url + "/v1/engine/events", headers=AUTH,
                      timeout=30) as response:
        stream = events(response)  # kept: a dropped iterator would close the response
        next(stream)
        assert open_streams() == 1
    deadline = time.monotonic() + 10
    while open_streams() != 0:
        assert time.monotonic() < deadline, "the stream outlived its client"
        time.sleep(0.1)


def test_bench_records_the_servers_timeline(server, tmp_path):
    async def two_requests():
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": True}
            answers = await asyncio.gather(*[client.post(
                server.url + "/v1/completions", json=body, headers=AUTH) for _ in range(2)])
        return [a.json()["id"] + "-0" for a in answers]

    ids, events = asyncio.run(record_engine_events(two_requests(), server.url, AUTH))
    for rid in ids:
        assert [e["state"] for e in events if e["request_id"] == rid] == [
            "queued", "prefill", "decode", "finished"]
    page = write_run_timeline(tmp_path, "two <requests>", [], events).read_text()
    assert "renderTimeline" in page and ids[0] in page and "two &lt;requests&gt;" in page
    assert "lifecycle events (GET /v1/engine/events)" in page
    # A server without the endpoint: the recorder says so, and the client's view is drawn.
    unguarded = asyncio.run(record_engine_events(two_requests(), server.url + "/nowhere",
                                                 AUTH))
    assert unguarded[1] is None


def test_the_client_view_when_the_server_sends_no_events(tmp_path):
    results = [RequestResult(0, 1, None, 10, 4, 0.0, start=0.5, ttft=0.2, e2e=0.9,
                             output_tokens=4, success=True),
               RequestResult(1, 2, 3, 10, 4, 0.0, start=0.6, error="HTTP 500")]
    events = client_events(results)
    assert [(e["request_id"], e["state"], e["t"]) for e in events] == [
        ("request-0", "queued", 0.5), ("request-0", "decode", 0.7),
        ("request-0", "finished", 1.4), ("request-1", "queued", 0.6),
        ("request-1", "aborted", 0.6)]
    page = write_run_timeline(tmp_path, "run", results, None).read_text()
    assert "as the client saw it" in page and '"user":"user-2"' in page


class FakeEngine:
    """What the hub and the routes ask of an engine client."""

    def __init__(self) -> None:
        self.tracing: list[tuple[bool, float]] = []
        self.stat_loggers: list = []
        self.max_model_len = 64
        self.config = EngineConfig(model="fake")
        self.replicas: list[dict] = []  # data parallel: one state per replica

    def replica_states(self) -> list[dict]:
        return self.replicas

    def set_tracing(self, enabled: bool, interval: float) -> None:
        self.tracing.append((enabled, interval))


def test_the_first_client_turns_tracing_on_and_the_last_turns_it_off():
    async def scenario():
        engine = FakeEngine()
        hub = EngineEventHub(engine, {"model": "fake"}, interval=0.05)
        first, second = hub.stream(), hub.stream()
        assert (await first.__anext__()).startswith(b"event: config\n")
        await second.__anext__()
        assert engine.tracing == [(True, 0.025)] and len(hub.streams) == 2
        assert (await first.__anext__()).startswith(b"event: snapshot\n")
        task = hub._task
        await first.aclose()
        assert engine.tracing == [(True, 0.025)] and len(hub.streams) == 1
        await second.aclose()
        await asyncio.sleep(0)
        assert engine.tracing[-1][0] is False and not hub.streams
        assert task.cancelled() and hub._task is None

    asyncio.run(scenario())


def test_thread_mode_feeds_the_hub_too(tiny_llama):
    """--engine-mode thread: the engine on a thread of the server's process."""

    async def scenario():
        engine = AsyncLLM.from_config(EngineConfig(model=str(tiny_llama), num_kv_blocks=32,
                                                   swap_space=0.01), engine_mode="thread")
        try:
            hub = EngineEventHub(engine, {}, interval=0.05)
            engine.stat_loggers.append(hub)
            stream = hub.stream()
            await stream.__anext__()
            params = SamplingParams(max_tokens=6, ignore_eos=True)
            async for _ in engine.generate(None, params, "r1", prompt_token_ids=[1, 2, 3]):
                pass
            states, generated = [], 0.0
            while not states or states[-1] != "finished":
                name, _, data = (await asyncio.wait_for(stream.__anext__(), 10)).decode(
                    ).partition("\ndata: ")
                data = json.loads(data)
                if name == "event: lifecycle":
                    states += [e["state"] for e in data["events"] if e["request_id"] == "r1"]
                else:
                    generated += data["generation_throughput"]
            assert states == ["queued", "prefill", "decode", "finished"] and generated > 0
            await stream.aclose()
            deadline = time.monotonic() + 10
            while engine._client.core.tracer is not None:  # the last client turned it off
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
        finally:
            engine.shutdown()

    asyncio.run(scenario())


def test_disable_dashboard_keeps_the_events_but_not_the_page():
    app = FastAPI()
    add_dashboard_routes(app, FakeEngine(), interval=1.0, page=False)
    client = TestClient(app)
    assert client.get("/dashboard").status_code == 404
    assert client.get("/dashboard/static/dashboard.js").status_code == 404
    assert any(route.path == "/v1/engine/events" for route in app.routes)


def test_data_parallel_replicas_are_merged_into_one_view():
    """Each replica's stats and traces come with its engine_idx: a snapshot adds their
    queues and blocks up, sets their block maps side by side, and has the events of all."""

    def block_map(in_use: int, cells: str) -> dict:
        return {"total": 4, "in_use": in_use, "cached": 0, "free": 4 - in_use,
                "swap_total": 2, "swapped": 0, "cells": {"per_cell": 1, "map": cells},
                "swap_cells": {"per_cell": 1, "map": "ff"}}

    hub = EngineEventHub(FakeEngine(), {})
    hub.streams.add(object())  # someone listens
    for engine_idx, (running, in_use, cells) in enumerate([(2, 3, "uuuf"), (1, 1, "ufff")]):
        hub.record(SchedulerStats(num_running=running, num_total_blocks=4,
                                  num_free_blocks=4 - in_use),
                   IterationStats(0.0, num_generation_tokens=5), engine_idx=engine_idx)
        hub.record_trace(TraceSample([LifecycleEvent(1.0, f"r{engine_idx}", "decode")], 2, 10,
                                     6, 64, block_map(in_use, cells), {f"w{engine_idx}": 0}),
                         engine_idx=engine_idx)
    events, snapshot = hub.take()
    assert [e["request_id"] for e in events] == ["r0", "r1"]
    assert snapshot["running"] == 3 and snapshot["kv_cache_usage"] == 0.5
    assert snapshot["block_map"]["cells"]["map"] == "uuufufff"
    assert (snapshot["block_map"]["total"], snapshot["block_map"]["in_use"]) == (8, 4)
    assert snapshot["steps"]["count"] == 4 and snapshot["ranks"] == {"w0": 0, "w1": 0}


def test_snapshots_show_the_disk_tier_only_when_there_is_one():
    hub = EngineEventHub(FakeEngine(), {})
    hub.streams.add(object())  # someone listens
    hub.record(SchedulerStats(num_total_blocks=4), IterationStats(0.0))
    assert hub.take()[1]["kv_disk"] is None
    hub.record(SchedulerStats(num_total_blocks=4, kv_disk_capacity_bytes=1000,
                              kv_disk_used_bytes=300, kv_disk_blocks=3, kv_disk_hits=16,
                              kv_disk_bytes_read=200, kv_disk_bytes_written=400,
                              kv_disk_evictions=1, kv_disk_corrupt=2), IterationStats(0.0))
    assert hub.take()[1]["kv_disk"] == {
        "used_bytes": 300, "capacity_bytes": 1000, "blocks": 3, "hit_tokens": 16,
        "bytes_read": 200, "bytes_written": 400, "evictions": 1, "corrupt": 2}
