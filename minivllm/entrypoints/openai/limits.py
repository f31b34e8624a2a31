"""Caps on what one HTTP request may ask for, each a `minivllm serve` flag. A request over a
cap gets 400 (413 for the body, 431 for the headers) with a message naming the flag."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class RequestLimits:
    max_request_body_mb: float = 16.0
    max_header_kb: float = 32.0  # request line + headers
    max_prompts_per_request: int = 128  # /v1/completions prompt lists
    max_n: int = 16  # n and best_of
    max_stop_strings: int = 16  # entries of stop, and of stop_token_ids

    @classmethod
    def from_args(cls, args) -> RequestLimits:
        """From parsed flags; a flag that is missing or None keeps its default."""
        given = {f.name: getattr(args, f.name, None) for f in fields(cls)}
        return cls(**{name: value for name, value in given.items() if value is not None})

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_request_body_mb * 1024 * 1024)

    @property
    def max_header_bytes(self) -> int:
        return int(self.max_header_kb * 1024)


HELP = {
    "max_request_body_mb": "larger request bodies get 413",
    "max_header_kb": "a larger request line + headers get 431",
    "max_prompts_per_request": "most prompts in one /v1/completions request",
    "max_n": "largest n and best_of",
    "max_stop_strings": "most stop strings, and most stop_token_ids, per request",
}


def add_limit_args(parser) -> None:
    for f in fields(RequestLimits):
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, type=type(f.default), default=f.default,
                            help=f"{HELP[f.name]} (default: {f.default:g})")
