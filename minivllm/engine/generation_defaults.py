"""The model's recommended sampling defaults, read from its generation_config.json, as vLLM's
`--generation-config` / `--override-generation-config` do.

`--generation-config auto` (the default) reads the model's generation_config.json; `vllm`
ignores it (SamplingParams' own defaults); a folder path reads that folder's file instead.
Only these keys count (vLLM's set): temperature, top_p, top_k, min_p, repetition_penalty, and
max_new_tokens, which becomes max_tokens. `--override-generation-config '{"temperature": 0.5}'`
is merged on top (with `vllm`, it is all there is); a null there removes a file's value.
The result is the default of every request field left unset: `LLM.generate` without
sampling params, and the OpenAI server for a request that omits (or sends null for) a field.
On the server max_tokens is a cap, as in vLLM: min(the request's or the rest of the
context, max_new_tokens).

The JSON file itself is read, not transformers' GenerationConfig, whose from_pretrained fills
in defaults that the file does not set (top_k=50 among them). `do_sample` is ignored, as vLLM
ignores it: a file with `"do_sample": false, "temperature": 0.6` gives temperature 0.6 (many
models ship such files; transformers would decode greedily, vLLM samples at 0.6). A file
without any of the keys above (do_sample alone included) changes nothing.

Torch-free: the server and the config can import it cheaply.
"""

from __future__ import annotations

import json
import logging
from importlib import resources
from pathlib import Path
from typing import Any

from minivllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

FILE_NAME = "generation_config.json"
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
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{prefix}not valid JSON ({e}): {value!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{prefix}must be a JSON object such as '{{\"temperature\": 0.5}}', "
                         f"got {value!r}")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise ValueError(f"{prefix}unknown key(s) {', '.join(map(repr, unknown))}; known: "
                         f"{', '.join(KEYS)}")
    try:
        to_sampling_fields(value, "", strict=True)
    except ValueError as e:
        raise ValueError(prefix + str(e).removeprefix(": ")) from None
    return dict(value)


def _model_file(model: str, revision: str | None) -> Path | None:
    """The model's generation_config.json, if it has one (a hub model's from the HF cache,
    where loading the engine put it, or downloaded)."""
    from minivllm.config import DEMO_MODEL_NAME

    if model == DEMO_MODEL_NAME:
        return Path(str(resources.files("minivllm") / "demo_model")) / FILE_NAME
    path = Path(model).expanduser()
    if path.is_dir():
        return path / FILE_NAME
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache

        cached = try_to_load_from_cache(model, FILE_NAME, revision=revision)
        if isinstance(cached, str):
            return Path(cached)
        return Path(hf_hub_download(model, FILE_NAME, revision=revision))
    except Exception as e:  # no such file in the repo, offline, not a hub id
        logger.debug("no %s for %s: %s", FILE_NAME, model, e)
        return None


def generation_config_file(generation_config: str, model: str,
                           revision: str | None = None) -> Path | None:
    """Which generation_config.json `--generation-config` reads; None for 'vllm'."""
    if generation_config == "vllm":
        return None
    if generation_config == "auto":
        return _model_file(model, revision)
    path = Path(generation_config).expanduser()
    return path / FILE_NAME if path.is_dir() else path


def load_sampling_defaults(config) -> tuple[dict[str, Any], str]:
    """(the default SamplingParams fields of an EngineConfig, a phrase saying where they came
    from). Empty when neither the file nor the override sets any."""
    path = generation_config_file(config.generation_config, config.model, config.revision)
    raw: dict[str, Any] = {}
    sources = []
    if path is not None and path.is_file():
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            logger.warning("cannot read %s (%s): no sampling defaults from it", path, e)
            raw = {}
        if not isinstance(raw, dict):
            raw = {}
        if any(raw.get(k) is not None for k in KEYS):
            sources.append(f"the model's generation config ({path})")
    override = config.override_generation_config or {}
    if override:
        sources.append(OVERRIDE_FLAG)
    merged = {**raw, **override}
    defaults = to_sampling_fields(merged, str(path) if path else OVERRIDE_FLAG, strict=False)
    return defaults, " and ".join(sources)


def describe(defaults: dict[str, Any], source: str) -> str:
    """One log line: the sampling defaults in force and where they come from."""
    if not defaults:
        return ("Default sampling parameters: SamplingParams' own (temperature=1.0, top_p=1.0, "
                "top_k=-1, min_p=0.0, repetition_penalty=1.0); the model's generation config "
                "sets none of them")
    fields = ", ".join(f"{k}={v}" for k, v in defaults.items())
    return (f"Default sampling parameters overridden by {source}: {fields}. They apply to "
            "requests that leave these fields unset; relaunch with --generation-config vllm "
            "to ignore the model's recommendation")


def default_sampling_params(defaults: dict[str, Any]) -> SamplingParams:
    return SamplingParams(**defaults)
