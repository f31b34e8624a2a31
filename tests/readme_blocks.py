"""The runnable blocks of README.md and of the documentation pages (docs/**/*.md), as each
file marks them with HTML comments (invisible when rendered), in the order they appear:

    <!-- readme-test: start minivllm serve -->   start this server; later blocks talk to it
    <!-- readme-test: serve -->                  the next block's lines are server commands:
                                                 each must come up; the last stays up
    <!-- readme-test: run -->                    run the next block (bash or python)
    <!-- readme-test: lm-eval -->                the lm-eval command (tests/e2e/test_lm_eval.py)

Each file is a sequence of its own: its blocks run top to bottom against the servers it
starts. Examples are written for port 8000; `with_port` moves them to the test's free port."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# A marker is a line of its own (one quoted inside a sentence or a table is text).
_MARKER = re.compile(r"^<!-- readme-test: (start|serve|run|lm-eval)(?: (.*?))? -->$", re.M)
_ANY_MARKER = re.compile(r"^[ \t]*<!--[ \t]*readme-test\b.*$", re.M)
_FENCE = re.compile(r"```(\w*)\n(.*?)\n```", re.S)


@dataclass
class Step:
    kind: str  # start | serve | run | lm-eval
    path: Path  # the file that holds it
    line: int  # 1-based line of the marker in that file
    lang: str = ""  # the block's language (bash, python); "" for start
    code: str = ""  # the block's text; for start, the server command

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    """README.md, then every page of the documentation site in path order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def file_steps(path: Path, text: str | None = None) -> list[Step]:
    """One file's steps. A marker that is misspelt, or not followed by its block, is an
    error: it would otherwise leave a block silently untested."""
    text = path.read_text() if text is None else text
    for marker in _ANY_MARKER.finditer(text):
        if not _MARKER.fullmatch(marker.group(0)):
            line = text.count("\n", 0, marker.start()) + 1
            raise ValueError(f"{path.name}:{line}: unknown marker {marker.group(0)!r}")
    steps = []
    for marker in _MARKER.finditer(text):
        line = text.count("\n", 0, marker.start()) + 1
        kind, argument = marker.group(1), marker.group(2)
        if kind == "start":
            steps.append(Step(kind, path, line, code=argument))
            continue
        fence = _FENCE.match(text, marker.end() + 1)  # the block right below the marker
        if fence is None:
            raise ValueError(f"{path.name}:{line}: '{kind}' marker without a block right below")
        steps.append(Step(kind, path, line, fence.group(1), fence.group(2)))
    return steps


def readme_steps() -> list[Step]:
    """Every file's steps, file after file."""
    return [step for path in doc_files() for step in file_steps(path)]


def commands(code: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", "", code)
    lines = (re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def with_port(code: str, port: int) -> str:
    """localhost:8000 / 127.0.0.1:8000 / --port 8000 on the test's port."""
    code = re.sub(r"(localhost|127\.0\.0\.1):8000\b", rf"\g<1>:{port}", code)
    return re.sub(r"--port \d+", f"--port {port}", code)


def server_command(command: str, port: int) -> str:
    command = with_port(command, port)
    return command if "--port" in command else f"{command} --port {port}"
