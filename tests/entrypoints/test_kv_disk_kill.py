"""The prefix cache's disk tier survives `kill -9` (issue 51's fault target): a server with
the tier is killed while requests run and blocks are being written, left with what a kill
mid-write leaves (a temporary file, a truncated block file, a flipped byte), and started
again on the same folder: it starts, serves, and every answer equals a fresh server's
without a tier. One process (`--engine-mode thread`), so that SIGKILL takes the engine
with it, as killing a server's process group does."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.server_utils import ServerProcess

pytestmark = pytest.mark.e2e

ENGINE = ["--num-kv-blocks", "12", "--block-size", "4", "--max-num-seqs", "2",
          "--engine-mode", "thread"]
PROMPTS = [list(range(5 + 11 * i, 29 + 11 * i)) for i in range(5)]  # 24 tokens each


def answer(server: ServerProcess, prompt: list[int]) -> str:
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    response.raise_for_status()
    return response.json()["choices"][0]["text"]


def test_a_killed_server_restarts_and_answers_as_a_fresh_one(tiny_llama, tmp_path):
    tier = tmp_path / "tier"
    disk = [*ENGINE, "--kv-offloading-backend", "disk", "--kv-offloading-path", str(tier)]
    fresh = ServerProcess(tiny_llama, ENGINE, tmp_path / "fresh.log")
    try:
        expected = [answer(fresh, p) for p in PROMPTS]
    finally:
        fresh.stop()

    first = ServerProcess(tiny_llama, disk, tmp_path / "first.log")
    for prompt in PROMPTS:  # 12 blocks hold two prompts: the others' blocks go to disk
        answer(first, prompt)
    written = sorted(tier.glob("*/*.kv"))
    assert len(written) >= 5, first.log()

    def keep_asking() -> None:  # requests in flight, blocks being written, when it dies
        try:
            for prompt in PROMPTS * 20:
                answer(first, prompt)
        except httpx.HTTPError:
            pass

    asking = threading.Thread(target=keep_asking)
    asking.start()
    first.proc.kill()  # SIGKILL: no shutdown, no flush
    first.proc.wait()
    asking.join()
    first.stop()

    folder = written[0].parent
    (folder / f"{written[0].stem}.12345.tmp").write_bytes(b"half a block")
    data = written[1].read_bytes()
    written[1].write_bytes(data[:len(data) // 2])
    data = bytearray(written[2].read_bytes())
    data[-9] ^= 0x40
    written[2].write_bytes(bytes(data))

    second = ServerProcess(tiny_llama, disk, tmp_path / "second.log")
    try:
        assert [answer(second, p) for p in PROMPTS] == expected
        assert not list(tier.glob("*/*.tmp"))  # the torn write is cleared at start
        assert second.metrics()["minivllm:kv_disk_corrupt_total"] >= 1, second.log()
    finally:
        second.stop()
