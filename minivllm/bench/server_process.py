"""A server as a child process, for `bench policies` (one per policy) and every benchmark
that starts one (minivllm's or a peer's): its command line, its port, starting it and waiting
for /health, stopping it."""

from __future__ import annotations

import json
import os
import signal
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


def start_server(command: list[str], log: Path, base_url: str, timeout: float = 600.0,
                 env: dict[str, str] | None = None, cwd: Path | None = None
                 ) -> tuple[subprocess.Popen, float]:
    """Start `command` (its output to `log`, `env` over this environment) and wait until
    `base_url`/health answers 200; the process and the seconds that took (its ready time).
    The server gets a session of its own, so that stop_server reaches every process it
    started (an engine core, a peer's workers)."""
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                env=None if env is None else {**os.environ, **env},
                                start_new_session=True)
    try:
        wait_healthy(base_url, proc, timeout, log)
    except BaseException:
        stop_server(proc)
        raise
    return proc, time.perf_counter() - started


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
        time.sleep(0.05)  # fine enough for the ready times benchmarks print
    raise RuntimeError(f"server at {base_url} not healthy after {timeout:.0f} s; see {log}")


def session_peak_rss(proc: subprocess.Popen) -> int:
    """Bytes: the sum of the peak resident memory (VmHWM) of every process still in the
    server's session (start_server gives it one): a front end and its engine core together.
    0 where /proc cannot tell."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) != proc.pid:  # the session id, after state, ppid and pgrp
                continue
            status = (stat.parent / "status").read_text()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                total += int(line.split()[1]) * 1024
    return total


def stop_server(proc: subprocess.Popen, timeout: float = 90.0) -> None:
    """SIGTERM, so that the server stops what it started (engine core, replicas, a Ray
    cluster) itself; SIGKILL if it has not exited within `timeout`. Then whatever is left
    of its session is killed: nothing it started outlives a benchmark."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left
