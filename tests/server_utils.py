"""Run a real `minivllm serve` process on a free localhost port for the server tests."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.model_factory import STORIES

# Small caches so that startup takes a second or two on two cores.
FAST_ENGINE_ARGS = ["--num-kv-blocks", "128", "--swap-space", "0.05", "--max-num-seqs", "8"]

# Where AsyncLLM's engine core runs (its EngineCoreClient): in a process of its own (the
# default) and on a thread of the server. The server tests that matter for both take a
# `params=ENGINE_MODES` fixture and pass engine_mode_args(request.param); the others run the
# default, or $MINIVLLM_ENGINE_MODE (MINIVLLM_ENGINE_MODE=thread runs them all on a thread).
# MINIVLLM_TEST_DATA_PARALLEL=N serves every test with N engine-core replicas on Ray (the
# third client; needs `make install-ray`): process mode only.
DATA_PARALLEL = int(os.environ.get("MINIVLLM_TEST_DATA_PARALLEL") or 1)
ENGINE_MODES = ("process", "thread") if DATA_PARALLEL == 1 else ("process",)


def single_engine_only(why: str):
    """Skip a test whose expectation holds for one engine core only (a replica's own queue
    bounds, its process, its log line), under MINIVLLM_TEST_DATA_PARALLEL."""
    return pytest.mark.skipif(DATA_PARALLEL > 1, reason=f"one engine core only: {why}")


def engine_mode_args(mode: str) -> list[str]:
    return ["--engine-mode", mode]

# Enough of a chat template for the stories model, which has none of its own.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def stories_model() -> Path:
    if not (STORIES / "model.safetensors").exists():
        pytest.skip("../shared/models/stories260K is not present")
    return STORIES


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A prelude that makes every engine step last at least 5 ms: long requests then keep the
# batch busy for seconds, however fast the machine.
SLOW_STEPS = """
import time
from minivllm.model.runner import ModelRunner

def _execute(self, *args, _original=ModelRunner.execute):
    time.sleep(0.005)
    return _original(self, *args)

ModelRunner.execute = _execute
"""

# How the server process starts: `python -c LAUNCH serve ...`.
LAUNCH = "import sys; from minivllm.cli import main; sys.exit(main())"


class ServerProcess:
    """`minivllm serve` in a child process. `prelude` is Python run at the start of that
    process and of the engine-core process it spawns: the hardening tests' fault injection
    patches the engine there. It is their sitecustomize module, which every Python process
    started with its folder on PYTHONPATH imports before anything else."""

    def __init__(self, model: Path, args: list[str], log_path: Path, prelude: str = "",
                 ready_timeout: float = 90) -> None:
        self.log_path = log_path
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if prelude:
            hook = log_path.with_name(log_path.stem + "-prelude")
            hook.mkdir(exist_ok=True)
            (hook / "sitecustomize.py").write_text(prelude)
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(hook), os.environ.get("PYTHONPATH")) if p)
        if DATA_PARALLEL > 1:
            args = [*args, "--data-parallel-size", str(DATA_PARALLEL)]
            ready_timeout = max(ready_timeout, 300)  # a Ray cluster starts too
        # The port is free when chosen, but another process (a Ray worker's, under data
        # parallel) may bind it before the server does: then start again on another.
        for attempt in range(3):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self._log = open(log_path, "wb")
            cmd = [sys.executable, "-c", LAUNCH, "serve", str(model), "--port",
                   str(self.port), *args]
            self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                         env=env)
            try:
                self._wait_ready(timeout=ready_timeout)
                return
            except RuntimeError:
                if attempt == 2 or "address already in use" not in self.log():
                    raise
                self._log.close()

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self, headers: dict | None = None) -> dict[str, float]:
        """/metrics as {"name{labels}": value}, minus the model_name label for brevity, and
        minus the engine label of data-parallel replicas: their series add up."""
        text = httpx.get(self.url + "/metrics", headers=headers, timeout=10).text
        values = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            key, value = line.rsplit(" ", 1)
            name, _, labels = key.partition("{")
            labels = [pair for pair in re.findall(r'\w+="[^"]*"', labels)
                      if not pair.startswith(("model_name=", "engine="))]
            key = name + ("{" + ",".join(labels) + "}" if labels else "")
            values[key] = values.get(key, 0.0) + float(value)
        return values

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
