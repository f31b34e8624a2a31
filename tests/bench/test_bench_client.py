"""`bench serve` and `bench policies` end to end against a fake OpenAI-compatible streaming server.

The fake server (aiohttp.web) has a word tokenizer with /tokenize and /detokenize, streams
max_tokens chunks (then OpenAI's empty end chunk, usage and [DONE]) and injects failures by
prompt length: n % 7 == 3 answers HTTP 500, n % 7 == 5 breaks off mid-stream with an error event.
Run as a script (`python test_bench_client.py --port P`) it is the server `bench policies` starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import threading
from pathlib import Path

import pytest
from aiohttp import web

from minivllm.bench.server_process import free_port

MAX_MODEL_LEN = 512


def fake_encode(text: str) -> list[int]:
    """BOS 1, then one id per word: `t<id>` is that id, any other word a byte-sum id."""
    ids = [1]
    for word in text.split():
        m = re.fullmatch(r"t(\d+)", word)
        ids.append(int(m.group(1)) if m else sum(word.encode()) % 400 + 3)
    return ids


def fake_app(record: list | None = None, record_file: str | None = None) -> web.Application:
    async def models(_):
        return web.json_response({"object": "list", "data": [
            {"id": "fake-model", "object": "model", "max_model_len": MAX_MODEL_LEN}]})

    async def tokenize(request):
        ids = fake_encode((await request.json())["prompt"])
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": MAX_MODEL_LEN})

    async def detokenize(request):
        ids = (await request.json())["tokens"]
        return web.json_response({"prompt": " ".join(f"t{i}" for i in ids if i != 1)})

    async def generate(request):
        body = await request.json()
        chat = request.path.endswith("chat/completions")
        if record is not None:
            record.append(body)
        if record_file:
            with open(record_file, "a") as f:
                f.write(json.dumps(body) + "\n")
        prompt = body["messages"][0]["content"] if chat else body["prompt"]
        n = len(prompt) if isinstance(prompt, list) else len(fake_encode(prompt))
        if n % 7 == 3:
            return web.json_response({"error": {"message": "injected failure"}}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(obj):
            await resp.write(f"data: {json.dumps(obj)}\n\n".encode())

        await asyncio.sleep(0.002 + n * 1e-5)  # "prefill"
        if chat:
            await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for i in range(body["max_tokens"]):
            if n % 7 == 5 and i == 2:
                await send({"error": {"message": "injected mid-stream failure", "code": 500}})
                return resp
            delta = {"delta": {"content": f" x{i}"}} if chat else {"text": f" x{i}"}
            await send({"choices": [{"index": 0, "finish_reason": None, **delta}]})
            await asyncio.sleep(0.001)
        end = {"delta": {"content": ""}} if chat else {"text": ""}
        await send({"choices": [{"index": 0, "finish_reason": "length", **end}]})
        await send({"choices": [], "usage": {"prompt_tokens": n,
                                             "completion_tokens": body["max_tokens"]}})
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def health(_):
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    return app


class FakeServer:
    """The fake server on a free port, in a thread with its own event loop."""

    def __init__(self) -> None:
        self.record: list[dict] = []
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.runner = web.AppRunner(fake_app(self.record))
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        self.loop.run_until_complete(site.start())
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self) -> str:
        self.thread.start()
        assert self.ready.wait(10)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def bench(*argv: str) -> int:
    from minivllm.bench import cli

    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *argv])
    return args.func(args)


def expected_failures(requests: list[dict]) -> tuple[int, int]:
    http = sum(r["prompt_tokens"] % 7 == 3 for r in requests)
    stream = sum(r["prompt_tokens"] % 7 == 5 for r in requests)
    return http, stream


def check_accounting(doc: dict, num: int) -> None:
    requests = doc["requests"]
    assert len(requests) == num and [r["index"] for r in requests] == list(range(num))
    http, stream = expected_failures(requests)
    assert http + stream > 0, "the workload should hit the injected failures"
    assert doc["summary"]["failed"] == http + stream
    assert doc["summary"]["completed"] == num - http - stream
    assert doc["summary"]["output_length_mismatches"] == 0
    for r in requests:
        n = r["prompt_tokens"]
        if n % 7 == 3:
            assert not r["success"] and r["error"].startswith("HTTP 500")
        elif n % 7 == 5:
            assert not r["success"] and "mid-stream" in r["error"]
        else:
            assert r["success"] and r["error"] == ""
            assert r["output_tokens"] == r["expected_output_tokens"]
            assert len(r["itl"]) == r["output_tokens"] - 1  # the empty end chunk is no token
            assert 0 < r["ttft"] <= r["e2e"] and r["start"] >= r["send_time"] - 0.01


def test_bench_serve_seed_workload_accounts_for_every_request(tmp_path, capsys):
    server = FakeServer()
    with server as url:
        rc = bench("serve", "--base-url", url, "--workload", "seed-high", "--num-prompts", "60",
                   "--priority", "length", "--goodput", "ttft:1000", "tpot:100",
                   "--output", str(tmp_path), "--disable-tqdm")
    assert rc == 0
    out = capsys.readouterr().out
    assert "length scale 0.01562 (auto: context / 32768)" in out
    doc = json.loads((tmp_path / "run.json").read_text())
    check_accounting(doc, 60)
    assert doc["meta"]["length_scale"] == 512 / 32768
    assert doc["summary"]["goodput"] is not None
    assert all(r["prompt_tokens"] + r["expected_output_tokens"] <= MAX_MODEL_LEN
               for r in doc["requests"])
    for name in ("summary.md", "ttft_cdf.png", "buckets.png"):
        assert (tmp_path / name).stat().st_size > 0
    # ids mode: the prompt is the token-id list, exactly the trace's length; priority by length
    assert sorted(len(b["prompt"]) for b in server.record) == sorted(
        r["prompt_tokens"] for r in doc["requests"])
    by_len = {len(b["prompt"]): b["priority"] for b in server.record}
    t1, t2 = doc["summary"]["bucket_thresholds"]
    assert all(p == (0 if n < t1 else 1 if n <= t2 else 2) for n, p in by_len.items())


def test_payloads_and_chat_endpoint_with_concurrency_limit(tmp_path):
    server = FakeServer()
    with server as url:
        rc = bench("serve", "--base-url", url, "--workload", "random", "--num-prompts", "30",
                   "--input-len", "41", "--output-len", "6", "--request-rate", "200",
                   "--burstiness", "0.5", "--max-concurrency", "4", "--endpoint", "chat",
                   "--priority", "user", "--output", str(tmp_path), "--disable-tqdm")
    assert rc == 0
    doc = json.loads((tmp_path / "run.json").read_text())
    assert len(doc["requests"]) == 30 and doc["summary"]["completed"] == 30
    assert all(r["output_tokens"] == 6 and len(r["itl"]) == 5 for r in doc["requests"])
    assert len(server.record) == 30
    for body in server.record:
        assert body["stream"] and body["ignore_eos"] and body["max_tokens"] == 6
        assert body["stream_options"] == {"include_usage": True}
        assert body["priority"] in (0, 1, 2)
        # text mode: the message re-tokenizes to exactly the requested 41 tokens (BOS counted)
        assert len(fake_encode(body["messages"][0]["content"])) == 41


def test_bench_policies_replays_the_same_trace_per_server(tmp_path, monkeypatch):
    from minivllm.bench import compare_policies

    record = tmp_path / "payloads.jsonl"

    def fake_server_command(model, port, policy, flags, length_predictor, prediction_log):
        assert length_predictor == "mean" and prediction_log.name == "predictions.jsonl"
        assert model == "some-model" and "--active-preemption" in flags
        return [sys.executable, __file__, "--port", str(port), "--record", f"{record}.{policy}"]

    monkeypatch.setattr(compare_policies, "server_command", fake_server_command)
    rc = bench("policies", "--model", "some-model", "--workload", "seed-high",
               "--num-prompts", "12", "--policies", "fcfs,priority", "--active-preemption",
               "--output", str(tmp_path), "--disable-tqdm")
    assert rc == 0
    fcfs = [json.loads(x) for x in Path(f"{record}.fcfs").read_text().splitlines()]
    prio = [json.loads(x) for x in Path(f"{record}.priority").read_text().splitlines()]
    key = sorted((str(b["prompt"]), b["max_tokens"]) for b in fcfs)
    assert len(fcfs) == 12 and key == sorted((str(b["prompt"]), b["max_tokens"]) for b in prio)
    assert all("priority" not in b for b in fcfs) and all("priority" in b for b in prio)
    assert all(b["temperature"] == 0.0 for b in fcfs + prio)  # policies: greedy by default
    md = (tmp_path / "comparison.md").read_text()
    # a row per bucket, + the policy table and the held-out length prediction table
    assert md.count("| fcfs |") == 5 and md.count("| priority |") == 5
    assert "priority vs fcfs" in md
    for name in ("comparison.json", "comparison_ttft_cdf.png", "comparison_buckets.png",
                 "fcfs/run.json", "priority/run.json", "server-fcfs.log"):
        assert (tmp_path / name).exists()
    check_accounting(json.loads((tmp_path / "priority" / "run.json").read_text()), 12)


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def test_bench_serve_sends_no_sampling_fields_unless_given(tmp_path):
    server = FakeServer()
    with server as url:
        assert bench("serve", "--base-url", url, "--workload", "random", "--num-prompts", "4",
                     "--input-len", "8", "--output-len", "3", "--output", str(tmp_path / "a"),
                     "--disable-tqdm") == 0
        default = list(server.record)
        server.record.clear()
        assert bench("serve", "--base-url", url, "--workload", "random", "--num-prompts", "4",
                     "--input-len", "8", "--output-len", "3", "--temperature", "0.8",
                     "--top-p", "0.95", "--top-k", "20", "--min-p", "0.05",
                     "--repetition-penalty", "1.1", "--output", str(tmp_path / "b"),
                     "--disable-tqdm") == 0
        sampled = list(server.record)
    # absent flags: nothing sent, the server's default applies (as in vllm bench serve)
    assert len(default) == 4 and not any(k in b for b in default for k in SAMPLING_KEYS)
    want = {"temperature": 0.8, "top_p": 0.95, "top_k": 20, "min_p": 0.05,
            "repetition_penalty": 1.1}
    assert len(sampled) == 4 and all({k: b[k] for k in SAMPLING_KEYS} == want for b in sampled)
    meta = json.loads((tmp_path / "b" / "run.json").read_text())["meta"]
    assert meta["sampling"] == want and "temperature 0.8, top_p 0.95" in meta["title"]
    assert json.loads((tmp_path / "a" / "run.json").read_text())["meta"]["sampling"] == {}


def test_backend_openai_chat_and_prompt_seed(tmp_path):
    server = FakeServer()
    common = ["--workload", "random", "--num-prompts", "3", "--input-len", "12",
              "--output-len", "2", "--disable-tqdm"]
    with server as url:
        assert bench("serve", "--base-url", url, "--backend", "openai-chat", *common,
                     "--output", str(tmp_path / "chat")) == 0
        assert all("messages" in b for b in server.record)
        server.record.clear()
        for name, extra in (("a", []), ("b", ["--prompt-seed", "7"])):
            assert bench("serve", "--base-url", url, "--backend", "openai", *common, *extra,
                         "--output", str(tmp_path / name)) == 0
        with pytest.raises(SystemExit, match="contradicts"):
            bench("serve", "--base-url", url, "--backend", "openai-chat", "--endpoint",
                  "completions", *common, "--output", str(tmp_path / "x"))
    first, second = server.record[:3], server.record[3:]
    # the same trace (lengths, arrivals), other prompts: no prefix-cache hits between runs
    assert [len(b["prompt"]) for b in first] == [len(b["prompt"]) for b in second]
    assert [b["prompt"] for b in first] != [b["prompt"] for b in second]


def test_make_payload_and_policy_flags_carry_sampling():
    from minivllm.bench import client
    from minivllm.bench.sampling import offline_params, sampling_flags
    from minivllm.bench.server_process import engine_flags

    body = client.make_payload("m", [1, 2], 4, False, None, 0, {"temperature": 0.7})
    assert body["temperature"] == 0.7 and body["prompt"] == [1, 2] and "top_p" not in body
    assert "temperature" not in client.make_payload("m", [1, 2], 4, False, None, 0)
    assert sampling_flags({"temperature": 0.8, "top_p": 0.95}) == [
        "--temperature", "0.8", "--top-p", "0.95"]
    params = offline_params({"top_k": 0, "temperature": 0.5}, max_tokens=3)
    assert (params.top_k, params.temperature, params.max_tokens) == (-1, 0.5, 3)
    # bench policies passes --override-generation-config on as JSON
    args = argparse.Namespace(override_generation_config={"temperature": 0.5})
    assert engine_flags(args) == ["--override-generation-config", '{"temperature": 0.5}']


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--record", default=None)
    ns = ap.parse_args()
    web.run_app(fake_app(record_file=ns.record), host="127.0.0.1", port=ns.port, print=None)
