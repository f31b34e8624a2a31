"""A minivllm server as a child process, for `bench policies` (one per policy) and the soak
benchmark: its command line, its port, waiting for /health, stopping it, and reading its
recompute tax from /metrics."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from minivllm.config import ENGINE_ARGS

SKIPPED_ENGINE_ARGS = ("model", "seed", "scheduling_policy", "tokenizer", "length_predictor",
                       "length_prediction_log")


def engine_flags(args) -> list[str]:
    """The engine flags given to `bench policies` that differ from their defaults, for serve."""
    flags = []
    for arg in ENGINE_ARGS.values():
        value = getattr(args, arg.name, None)
        if arg.name in SKIPPED_ENGINE_ARGS or value is None or value == arg.default:
            continue
        flag = "--" + arg.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, dict):  # --override-generation-config
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def server_command(model: str, port: int, policy: str, flags: list[str],
                   length_predictor: str = "mean", prediction_log: Path | None = None
                   ) -> list[str]:
    cmd = [sys.executable, "-m", "minivllm.cli", "serve", model, "--host",
           "127.0.0.1", "--port", str(port), "--scheduling-policy", policy,
           "--length-predictor", length_predictor, *flags]
    return cmd + (["--length-prediction-log", str(prediction_log)] if prediction_log else [])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base_url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"server exited with code {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server at {base_url} not healthy after {timeout:.0f} s; see {log}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def scrape_recompute_tax(base_url: str) -> float | None:
    """The server's recompute tax from /metrics (its counters since it started), or None
    where it does not count one."""
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    totals = {}
    for line in text.splitlines():
        for name in ("minivllm:num_recomputed_tokens_total", "minivllm:num_computed_tokens_total"):
            if line.startswith(name + "{") or line.startswith(name + " "):
                totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    computed = totals.get("minivllm:num_computed_tokens_total")
    if computed is None or "minivllm:num_recomputed_tokens_total" not in totals:
        return None
    return totals["minivllm:num_recomputed_tokens_total"] / computed if computed else 0.0
