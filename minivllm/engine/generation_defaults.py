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

Torch-free: the server can import it cheaply.
"""

from __future__ import annotations

import json
import logging
from importlib import resources
from pathlib import Path
from typing import Any

from minivllm.config import DEMO_MODEL_NAME, EngineConfig
from minivllm.generation_fields import KEYS, OVERRIDE_FLAG, to_sampling_fields
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

FILE_NAME = "generation_config.json"


def _model_file(model: str, revision: str | None) -> Path | None:
    """The model's generation_config.json, if it has one (a hub model's from the HF cache,
    where loading the engine put it, or downloaded)."""
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


def load_sampling_defaults(config: EngineConfig) -> tuple[dict[str, Any], str]:
    """(the default SamplingParams fields of an EngineConfig, a phrase saying where they came
    from). Empty when neither the file nor the override sets any."""
    model = config.model_config
    path = generation_config_file(model.generation_config, model.model, model.revision)
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
    override = model.override_generation_config or {}
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
