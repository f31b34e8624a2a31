"""generation_config.json's sampling keys as SamplingParams fields, and the parsing of
`--override-generation-config` (a JSON object of those keys). Pure and torch-free: the config
checks the override with it when it is built, engine/generation_defaults.py reads the model's
file with it.
"""

from __future__ import annotations

import logging
from typing import Any

from minivllm.json_object import json_object
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# generation_config.json key -> SamplingParams field
KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}
_INT_FIELDS = ("top_k", "max_tokens")
OVERRIDE_FLAG = "--override-generation-config"


def to_sampling_fields(raw: dict[str, Any], source: str, strict: bool) -> dict[str, Any]:
    """The SamplingParams fields that `raw` (generation_config.json keys) sets. A value
    SamplingParams would refuse raises (strict) or is logged and skipped (a model's file)."""
    out: dict[str, Any] = {}
    for key, name in KEYS.items():
        value = raw.get(key)
        if value is None:
            continue
        try:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"must be a number, got {value!r}")
            if name in _INT_FIELDS:
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError(f"must be an integer, got {value!r}")
                value = int(value)
                if name == "top_k" and value == 0:  # transformers' "no top-k"; ours is -1
                    value = -1
            else:
                value = float(value)
            SamplingParams(**{name: value})  # the ranges a request is held to
        except ValueError as e:
            if strict:
                raise ValueError(f"{source}: {key}: {e}") from None
            logger.warning("%s: ignoring %s=%r: %s", source, key, raw.get(key), e)
            continue
        out[name] = value
    return out


def parse_override(value: str | dict | None, flag: str | None = OVERRIDE_FLAG
                   ) -> dict[str, Any] | None:
    """--override-generation-config: a JSON object (or a dict) of generation_config keys.
    Bad JSON, an unknown key or a value out of range is a ValueError that starts with `flag`
    (None: no prefix, for argparse, which names the flag itself)."""
    if value is None:
        return None
    prefix = f"{flag}: " if flag else ""
    value = json_object(value, prefix, '{"temperature": 0.5}', KEYS)
    try:
        to_sampling_fields(value, "", strict=True)
    except ValueError as e:
        raise ValueError(prefix + str(e).removeprefix(": ")) from None
    return dict(value)
