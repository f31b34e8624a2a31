"""LoRARequest, spelled as vLLM's: which adapter a request runs with. Plain data (it crosses
to the engine core inside the EngineCoreRequest); the weights stay in the core, loaded from
`lora_path` the first time a request names the adapter.

It sits here, beside SamplingParams, not in lora/: core/'s requests carry it, and core/ sits
below lora/ (whose layers build on the model). Users import it from minivllm.lora."""

from __future__ import annotations

import msgspec


class LoRARequest(msgspec.Struct, frozen=True, omit_defaults=True):
    lora_name: str  # what a request's "model" field names it by
    # The engine's key for the adapter: the prefix cache and the loaded weights are keyed by
    # it, so two adapters must never share one (the server hands out a new id per load).
    lora_int_id: int
    lora_path: str = ""  # a PEFT folder: adapter_config.json + adapter_model.safetensors
    base_model_name: str | None = None  # /v1/models' `parent` (the served model by default)

    def __post_init__(self) -> None:
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be an integer >= 1, got {self.lora_int_id!r}")
        if not self.lora_name:
            raise ValueError("lora_name must not be empty")
        if not self.lora_path:
            raise ValueError(f"LoRA adapter {self.lora_name!r}: lora_path must be given")
