"""The README's runnable blocks, as the README marks them with HTML comments (invisible when
rendered), in the order they appear:

    <!-- readme-test: start minivllm serve -->   start this server; later blocks talk to it
    <!-- readme-test: serve -->                  the next block's lines are server commands:
                                                 each must come up; the last stays up
    <!-- readme-test: run -->                    run the next block (bash or python)
    <!-- readme-test: lm-eval -->                the lm-eval command (tests/test_lm_eval.py)

Examples are written for port 8000; `with_port` moves them to the test's free port."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
_MARKER = re.compile(r"<!-- readme-test: (start|serve|run|lm-eval)(?: (.*?))? -->")
_FENCE = re.compile(r"```(\w*)\n(.*?)\n```", re.S)


@dataclass
class Step:
    kind: str  # start | serve | run | lm-eval
    line: int  # 1-based line of the marker in README.md
    lang: str = ""  # the block's language (bash, python); "" for start
    code: str = ""  # the block's text; for start, the server command


def readme_steps(text: str | None = None) -> list[Step]:
    text = README.read_text() if text is None else text
    steps = []
    for marker in _MARKER.finditer(text):
        line = text.count("\n", 0, marker.start()) + 1
        kind, argument = marker.group(1), marker.group(2)
        if kind == "start":
            steps.append(Step(kind, line, code=argument))
            continue
        fence = _FENCE.match(text, marker.end() + 1)  # the block right below the marker
        if fence is None:
            raise ValueError(f"README.md:{line}: '{kind}' marker without a block right below")
        steps.append(Step(kind, line, fence.group(1), fence.group(2)))
    return steps


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
