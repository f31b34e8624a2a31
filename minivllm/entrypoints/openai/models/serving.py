"""The models the server answers to: the base model and its LoRA adapters, named by
--lora-modules at start and, where runtime updating is allowed, loaded and unloaded by
POST /v1/load_lora_adapter and /v1/unload_lora_adapter. A request picks an adapter by its
"model" field. An adapter's files are checked here, before its name is served (PEFT's
format, its rank, its shapes against the base model); the engine core loads the tensors
on the first request that names it.

Runtime updating is off unless the server is started with --allow-runtime-lora-updating
or the environment sets VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (vLLM's variable, so that
deployments written for vLLM work unchanged): an endpoint that reads any folder the
server's user can read is not something to open by default."""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass

from pydantic import BaseModel

from minivllm.lora.peft_format import check_shapes, read_adapter
from minivllm.lora.request import LoRARequest

RUNTIME_UPDATING_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's; the name alone decides here


@dataclass(frozen=True)
class LoRAModule:
    """One --lora-modules entry."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(text: str) -> LoRAModule:
    """vLLM's two forms: name=path, or a JSON object with name, path and optionally
    base_model_name. A ValueError says what is wrong."""
    if text.lstrip().startswith("{"):
        try:
            entry = json.loads(text)
        except ValueError as e:
            raise ValueError(f"--lora-modules: {text!r} is not valid JSON ({e})") from None
        unknown = set(entry) - {"name", "path", "base_model_name"} if isinstance(entry, dict) \
            else {"(not an object)"}
        if unknown or not all(isinstance(entry.get(k), str) and entry[k] for k in ("name", "path")):
            raise ValueError(f"--lora-modules: {text!r} must be a JSON object with \"name\" and "
                             "\"path\" strings (and optionally \"base_model_name\")")
        return LoRAModule(entry["name"], entry["path"], entry.get("base_model_name"))
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--lora-modules: {text!r} must be name=path or a JSON object")
    return LoRAModule(name, path)


def check_lora_modules(values: list[str] | None, config) -> None:
    """--lora-modules spelt right and with --enable-lora, before the engine starts."""
    modules = [parse_lora_module(m) for m in values or ()]
    if modules and not config.lora_config.enable_lora:
        raise ValueError("--lora-modules needs --enable-lora")


def runtime_updating_allowed(flag: bool) -> bool:
    return flag or os.environ.get(RUNTIME_UPDATING_ENV, "").lower() in ("1", "true")


class OpenAIServingModels:
    def __init__(self, base_model_name: str, root: str, max_model_len: int,
                 hf_config=None, max_lora_rank: int | None = None,
                 lora_modules: tuple[LoRAModule, ...] = ()) -> None:
        """`hf_config` and `max_lora_rank`: the base model's config and the engine's
        max_lora_rank, to check adapters against; None when LoRA is not enabled. A bad
        --lora-modules entry is a ValueError."""
        self.base_model_name, self.root, self.max_model_len = base_model_name, root, max_model_len
        self.hf_config, self.max_lora_rank = hf_config, max_lora_rank
        self.lora_requests: dict[str, LoRARequest] = {}
        # A new id per load: the engine keys weights and cached prefixes by it, so an adapter
        # loaded again under an old name never meets the old one's blocks.
        self._ids = itertools.count(1)
        if lora_modules and max_lora_rank is None:
            raise ValueError("--lora-modules needs --enable-lora")
        for module in lora_modules:
            self.load(module.name, module.path, module.base_model_name)

    def load(self, name: str, path: str, base_model_name: str | None = None) -> LoRARequest:
        """Check the adapter and serve it under `name`; a ValueError says why not."""
        if self.max_lora_rank is None:
            raise ValueError("LoRA is not enabled on this server (start it with --enable-lora)")
        if name == self.base_model_name or name in self.lora_requests:
            raise ValueError(f"The lora adapter '{name}' has already been loaded.")
        spec = read_adapter(path, self.max_lora_rank)
        if self.hf_config is not None:
            check_shapes(spec, self.hf_config)
        lora = LoRARequest(name, next(self._ids), str(spec.path), base_model_name)
        self.lora_requests[name] = lora
        return lora

    def unload(self, name: str) -> None:
        """Stop serving `name` (requests already running with it finish with it); KeyError
        when it is not served."""
        del self.lora_requests[name]

    def cards(self, created: int) -> list[dict]:
        """/v1/models' entries: the base model, then each adapter with its parent."""
        base = {"id": self.base_model_name, "object": "model", "created": created,
                "owned_by": "minivllm", "root": self.root, "parent": None,
                "max_model_len": self.max_model_len}
        return [base] + [
            {"id": name, "object": "model", "created": created, "owned_by": "minivllm",
             "root": lora.lora_path, "parent": lora.base_model_name or self.base_model_name,
             "max_model_len": self.max_model_len}
            for name, lora in self.lora_requests.items()]
