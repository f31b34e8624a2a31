"""Every block that README.md or a documentation page (docs/) marks runnable runs as written
against a live `minivllm serve` on a free port, in the server's default engine mode (its own
process), so a documented line that stops working fails the build (tests/readme_blocks.py
says how blocks are marked). Each file runs on its own. Bash blocks run with
`set -euo pipefail` and a curl that fails on an HTTP error; a file's Python blocks run in
order in one namespace, as in a notebook."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.model_factory import STORIES
from tests.readme_blocks import (
    DOCS,
    README,
    ROOT,
    Step,
    commands,
    doc_files,
    file_steps,
    readme_steps,
    server_command,
    with_port,
)
from tests.server_utils import ServerProcess, free_port

# curl as the docs write it, but an HTTP error status fails the block.
BASH_PRELUDE = 'curl() { command curl --fail-with-body --show-error "$@"; }\n'
# The files with blocks to run (a file with none, or with only the lm-eval command, has
# nothing for the runner below).
RUNNABLE = [p for p in doc_files() if any(s.kind != "lm-eval" for s in file_steps(p))]


def _env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)  # `minivllm`, `lm_eval` of this environment
    # The default engine mode, as a user gets it, whatever the calling shell exported.
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONUNBUFFERED": "1", "MINIVLLM_ENGINE_MODE": "process"}


class ReadmeServer(ServerProcess):
    """A server a documentation file starts, with its own command line as written (port
    substituted); readiness, log and stop as the other server tests'."""

    def __init__(self, command: str, port: int, log: Path) -> None:
        self.port, self.url, self.log_path = port, f"http://127.0.0.1:{port}", log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(["bash", "-c", "exec " + command], cwd=ROOT, env=_env(),
                                     stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready(timeout=120)
        # Process mode: the engine core is a child process of the server.
        assert psutil.Process(self.proc.pid).children(), f"{command}: no engine-core process"


def _run_bash(code: str, where: str) -> None:
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + BASH_PRELUDE + code], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{where} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"


def _run_python(code: str, namespace: dict, where: str) -> None:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            # dont_inherit: the block as a user runs it, without this module's __future__
            exec(compile(code, where, "exec", dont_inherit=True), namespace)
    except Exception as e:
        raise AssertionError(f"{where} failed: {e!r}\n{out.getvalue()}") from e


def _run_steps(steps: list[Step], tmp_path: Path) -> None:
    port = free_port()
    live: ReadmeServer | None = None
    namespace: dict = {"__name__": "__readme__"}
    try:
        for step in steps:
            if step.kind in ("start", "serve"):
                lines = [step.code] if step.kind == "start" else commands(step.code)
                for i, line in enumerate(lines):
                    if live is not None:
                        live.stop()
                    live = ReadmeServer(server_command(line, port), port,
                                        tmp_path / f"server-{step.line}-{i}.log")
            elif step.kind == "run":
                code = with_port(step.code, port)
                if step.lang == "python":
                    _run_python(code, namespace, step.where)
                else:
                    _run_bash(code, step.where)
    finally:
        if live is not None:
            live.stop()


@pytest.mark.e2e  # make test-e2e (also run by CI), not make test
@pytest.mark.timeout(900)  # serving.md starts five servers: about a minute on a quiet machine
@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_blocks_run_as_written(path, tmp_path):
    if not (STORIES / "model.safetensors").exists():
        pytest.skip("the examples use ../shared/models/stories260K")
    _run_steps(file_steps(path), tmp_path)


def test_the_runnable_blocks_are_still_marked():
    """Blocks that lose their marker are no longer tested: the count may only grow (raise it
    when you mark more)."""
    steps = readme_steps()
    assert sum(s.kind == "run" for s in steps) >= 22
    assert sum(s.kind in ("start", "serve") for s in steps) >= 10
    assert [s.kind for s in steps].count("lm-eval") == 1
    assert {p.name for p in RUNNABLE} >= {"README.md", "serving.md", "offline.md",
                                          "scheduling.md", "structured-outputs.md",
                                          "quantization.md"}


def test_the_documented_chat_template_is_the_shipped_file():
    template = (ROOT / "examples" / "chat_template.jinja").read_text()
    assert "```jinja\n" + template + "```" in (DOCS / "serving.md").read_text()


@pytest.mark.parametrize("text", ["<!-- readme-test: runn -->\n```bash\ntrue\n```\n",
                                  "<!-- readme-test: run -->\nno block\n"])
def test_a_broken_marker_is_an_error_not_an_untested_block(text):
    with pytest.raises(ValueError, match="page.md:1"):
        file_steps(DOCS / "page.md", text)


def test_the_readme_links_point_at_files_of_the_repository():
    """mkdocs --strict checks the docs' links; the README is not part of the site."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert local and all((ROOT / link).is_file() for link in local), local
