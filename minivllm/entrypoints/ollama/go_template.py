"""The part of Go's text/template that /api/generate's `template` field uses (Ollama's
TEMPLATE): {{ .System }}, {{ .Prompt }} and {{ .Response }} (empty: the model writes it),
{{ if .Name }} ... {{ else }} ... {{ end }}, and the {{- -}} trim markers. Anything else
({{ range .Messages }}, functions) is a ValueError naming it: the chat template of the model
renders conversations (/api/chat)."""

from __future__ import annotations

import re

_ACTION = re.compile(r"\{\{(-?)(.*?)(-?)\}\}", re.DOTALL)
_FIELD = re.compile(r"\.(System|Prompt|Response)")


def _pieces(template: str) -> list[tuple[str, str]]:
    """("text", text) and ("action", body) in order, with the trim markers applied."""
    pieces: list[tuple[str, str]] = []
    at, trim_next = 0, False
    for match in _ACTION.finditer(template):
        text = template[at:match.start()]
        if trim_next:
            text = text.lstrip()
        if match.group(1):
            text = text.rstrip()
        pieces += [("text", text), ("action", match.group(2).strip())]
        at, trim_next = match.end(), bool(match.group(3))
    tail = template[at:]
    pieces.append(("text", tail.lstrip() if trim_next else tail))
    return pieces


def render(template: str, values: dict[str, str]) -> str:
    """The template with `values` (System, Prompt, Response); ValueError for what it cannot
    render."""
    out: list[str] = []
    # One frame per open {{ if }}: (this branch is taken, some branch of it was taken)
    stack: list[tuple[bool, bool]] = []

    def live() -> bool:
        return all(taken for taken, _ in stack)

    for kind, body in _pieces(template):
        if kind == "text":
            if "{{" in body:
                raise ValueError("template: an action opened with {{ is never closed")
            if live():
                out.append(body)
            continue
        words = body.split()
        if not words:
            raise ValueError("template: an empty {{ }} action")
        if words[0] == "if" and len(words) == 2 and _FIELD.fullmatch(words[1]):
            taken = bool(values.get(words[1][1:]))
            stack.append((taken, taken))
        elif words[0] == "else" and len(words) == 1 and stack:
            _, done = stack.pop()
            stack.append((not done, True))
        elif words[0] == "end" and len(words) == 1 and stack:
            stack.pop()
        elif len(words) == 1 and _FIELD.fullmatch(words[0]):
            if live():
                out.append(values.get(words[0][1:], ""))
        else:
            raise ValueError(f"template: {{{{ {body[:80]} }}}} is not supported here (only "
                             ".System, .Prompt, .Response and if/else/end on them)")
    if stack:
        raise ValueError("template: an {{ if }} without its {{ end }}")
    return "".join(out)
