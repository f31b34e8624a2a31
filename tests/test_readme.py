"""Every block the README marks runnable runs as written against a live `minivllm serve` on a
free port (tests/readme_blocks.py says how blocks are marked), so a README line that stops
working fails the build. Bash blocks run with `set -euo pipefail` and a curl that fails on an
HTTP error; Python blocks run in order in one namespace, as in a notebook."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.model_factory import STORIES
from tests.readme_blocks import README, commands, readme_steps, server_command, with_port
from tests.server_utils import ServerProcess, free_port

pytestmark = pytest.mark.e2e  # make test-e2e (also run by CI), not make test

ROOT = README.parent
# curl as the README writes it, but an HTTP error status fails the block.
BASH_PRELUDE = 'curl() { command curl --fail-with-body --show-error "$@"; }\n'


def _env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)  # `minivllm`, `lm_eval` of this environment
    # The engine on a thread: the same commands start in about half the time (no second
    # interpreter, no second model load), and both modes are tested elsewhere.
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONUNBUFFERED": "1", "MINIVLLM_ENGINE_MODE": "thread"}


class ReadmeServer(ServerProcess):
    """A server the README starts, with its own command line as written (port substituted);
    readiness, log and stop as the other server tests'."""

    def __init__(self, command: str, port: int, log: Path) -> None:
        self.port, self.url, self.log_path = port, f"http://127.0.0.1:{port}", log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(["bash", "-c", "exec " + command], cwd=ROOT, env=_env(),
                                     stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready(timeout=120)


def _run_bash(code: str, where: str) -> None:
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + BASH_PRELUDE + code], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{where} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"


def _run_python(code: str, namespace: dict, where: str) -> None:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, where, "exec"), namespace)
    except Exception as e:
        raise AssertionError(f"{where} failed: {e!r}\n{out.getvalue()}") from e


@pytest.mark.timeout(900)  # seven server starts: about a minute on a quiet machine
def test_readme_runnable_blocks_run_as_written(tmp_path):
    if not (STORIES / "model.safetensors").exists():
        pytest.skip("the README's examples use ../shared/models/stories260K")
    steps = readme_steps()
    assert sum(s.kind == "run" for s in steps) >= 10 and any(s.kind == "serve" for s in steps)
    port = free_port()
    live: ReadmeServer | None = None
    namespace: dict = {"__name__": "__readme__"}
    try:
        for step in steps:
            where = f"README.md:{step.line}"
            if step.kind in ("start", "serve"):
                lines = [step.code] if step.kind == "start" else commands(step.code)
                for i, line in enumerate(lines):
                    if live is not None:
                        live.stop()
                    live = ReadmeServer(server_command(line, port), port,
                                        tmp_path / f"server-{step.line}-{i}.log")
            elif step.kind == "run":
                assert live is not None, f"{where}: no server started before this block"
                code = with_port(step.code, port)
                if step.lang == "python":
                    _run_python(code, namespace, where)
                else:
                    _run_bash(code, where)
    finally:
        if live is not None:
            live.stop()


def test_the_readme_chat_template_is_the_shipped_file():
    template = (ROOT / "examples" / "chat_template.jinja").read_text()
    assert "```jinja\n" + template + "```" in README.read_text()
