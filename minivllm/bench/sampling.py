"""Sampling flags shared by every benchmark: --temperature --top-p --top-k --min-p
--repetition-penalty.

A flag that is absent is not sent, so the server applies its own default (the model's
generation_config.json on minivllm and vLLM), as `vllm bench serve` does. Benchmarks whose
published tables were measured greedy keep temperature 0 as their default (`greedy=True`);
their other flags are still absent unless given.
"""

from __future__ import annotations

import argparse
from typing import Any

FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
SAMPLED = {"temperature": 0.8, "top_p": 0.95}  # the "sampled" scenario of compare_serving


def add_sampling_args(parser: argparse.ArgumentParser, greedy: bool = False) -> None:
    absent = "default: 0, greedy" if greedy else "default: not sent"
    group = parser.add_argument_group(
        "sampling", "sent with every request; an absent flag is not sent" +
        (" (but temperature defaults to 0: this benchmark's tables are greedy)" if greedy
         else ", so the server's default applies (the model's generation config)"))
    group.add_argument("--temperature", type=float, default=0.0 if greedy else None,
                       help=f"({absent})")
    group.add_argument("--top-p", type=float, default=None, help="(default: not sent)")
    group.add_argument("--top-k", type=int, default=None, help="(default: not sent)")
    group.add_argument("--min-p", type=float, default=None, help="(default: not sent)")
    group.add_argument("--repetition-penalty", type=float, default=None,
                       help="(default: not sent)")


def sampling_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling fields given (request body names), in FIELDS order."""
    return {name: getattr(args, name) for name in FIELDS if getattr(args, name, None) is not None}


def sampling_flags(fields: dict[str, Any]) -> list[str]:
    """The command-line flags that give `fields` (for a benchmark that runs another)."""
    flags: list[str] = []
    for name in FIELDS:
        if fields.get(name) is not None:
            flags += ["--" + name.replace("_", "-"), str(fields[name])]
    return flags


def describe(fields: dict[str, Any]) -> str:
    """'greedy', 'the server's default sampling' or 'temperature 0.8, top_p 0.95'."""
    if not fields:
        return "the server's default sampling"
    if fields.get("temperature") == 0 and len(fields) == 1:
        return "greedy"
    return ", ".join(f"{k} {v}" for k, v in fields.items())


def offline_params(fields: dict[str, Any] | None, base=None, **kwargs):
    """SamplingParams for an offline benchmark: `base` (LLM.get_default_sampling_params(),
    the offline "server default"; None: SamplingParams()) with `fields` and `kwargs` set."""
    import dataclasses

    from minivllm.sampling_params import SamplingParams

    base = base if base is not None else SamplingParams()
    fields = dict(fields or {})
    if fields.get("top_k") == 0:  # the server's spelling of "no top-k"
        fields["top_k"] = -1
    return dataclasses.replace(base, **fields, **kwargs)


def model_defaults(config):
    """SamplingParams with an EngineConfig's generation-config defaults: the base of
    offline_params for benchmarks that drive LLMEngine directly."""
    from minivllm.engine.generation_defaults import load_sampling_defaults
    from minivllm.sampling_params import SamplingParams

    return SamplingParams(**load_sampling_defaults(config)[0])


def is_plain_greedy(fields: dict[str, Any]) -> bool:
    """Argmax decoding: temperature 0 and no repetition penalty (what an argmax-only peer
    runner can do)."""
    return fields.get("temperature") == 0 and fields.get("repetition_penalty", 1.0) == 1.0


def hf_generate_kwargs(fields: dict[str, Any]) -> dict[str, Any]:
    """transformers generate() arguments for `fields`; absent fields take SamplingParams'
    neutral values (not the model's generation_config, where top_k is 50)."""
    temperature = fields.get("temperature", 1.0)
    kwargs: dict[str, Any] = {"repetition_penalty": fields.get("repetition_penalty", 1.0)}
    if temperature == 0:
        return {**kwargs, "do_sample": False}
    top_k = fields.get("top_k", -1)
    return {**kwargs, "do_sample": True, "temperature": temperature,
            "top_p": fields.get("top_p", 1.0), "top_k": 0 if top_k in (-1, 0) else top_k,
            "min_p": fields.get("min_p") or None}
