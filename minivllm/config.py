"""EngineConfig: the one configuration object, built once and validated at construction.

It holds one section per part of the engine, as vLLM's VllmConfig does: `model_config`,
`cache_config`, `scheduler_config` (core/scheduler.py's, what the scheduler runs with),
`policy_config` (core/policy.py's; each policy checks its own options), `lora_config` and
`parallel_config`.
The keyword arguments stay flat, named as vLLM's, and the CLI flags are the same names with
dashes: EngineConfig(model=..., max_num_seqs=...) hands each name to the section that holds
it (ENGINE_ARGS), and config.max_num_seqs reads config.scheduler_config.max_num_seqs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_type_hints

from minivllm.core.kv_transfer import KVTransferConfig, parse_kv_transfer_config
from minivllm.core.policy import PolicyConfig
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.generation_fields import parse_override
from minivllm.pooling_params import parse_pooler_config

DEMO_MODEL_NAME = "minivllm-demo"
DEFAULT_KV_CACHE_SPACE = 4.0  # GiB; vLLM's CPU build also defaults to a fixed 4 GiB
# vLLM's --runner and --convert values that minivllm runs (vLLM's also has the draft runner
# and the classify and reward conversions).
RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed")
# --kv-cache-dtype: vLLM's names (model/kv_quant.py has the quantized ones)
KV_CACHE_DTYPES = ("auto", "bfloat16", "bf16", "int8", "fp8", "fp8_e4m3", "fp8_e5m2")


def _bad(config, name: str, why: str) -> ValueError:
    return ValueError(f"{name} {why}, got {getattr(config, name)!r}")


def _names_gguf_file(model: str) -> bool:
    """model/gguf.py's is_gguf_model, not imported here: that module imports torch."""
    return model.endswith(".gguf") or (":" in model and not Path(model).expanduser().exists())


@dataclass
class ModelConfig:
    """The model, its weights' dtype and device, and its sampling defaults."""

    model: str = DEMO_MODEL_NAME
    tokenizer: str | None = None
    served_model_name: str | None = None
    # auto | float32 | bfloat16 | float16. With a GGUF file's blocks (quantization gguf),
    # auto and float32 are fp32 activations; bfloat16 the CPU's bf16 (model/runner.py).
    dtype: str = "auto"
    # unset: gguf for a GGUF file (as vLLM and llama.cpp run one), else none; resolved here,
    # once, so the engine and its logs read the value that runs.
    # none: every weight in the dtype (a GGUF file's blocks dequantized at load) |
    # int8: W8A8 linear layers, quantized at load (model/linear/int8.py) |
    # gguf: a GGUF file's linear weights and embeddings run as stored (model/linear/gguf.py)
    quantization: str | None = None
    device: str = "auto"  # auto | cpu | cuda
    seed: int = 0
    revision: str | None = None
    max_logprobs: int = 20
    # Sampling defaults (engine/generation_defaults.py): "auto" reads the model's
    # generation_config.json, "vllm" ignores it, or a folder holding a generation_config.json.
    generation_config: str = "auto"
    override_generation_config: dict[str, Any] | None = None  # e.g. {"temperature": 0.5}
    # How pooling requests (embeddings) pool, vLLM's JSON: {"pooling_type": "MEAN",
    # "normalize": true}; unset keys: LAST, normalized (pooling_params.py).
    pooler_config: dict[str, Any] | None = None
    # vLLM's runner and conversion (RUNNERS, CONVERTS): which requests the engine serves,
    # resolved by runner_type.
    runner: str = "auto"
    convert: str = "auto"
    # measure: where a linear can run more than one way (oneDNN or torch's fp32, AMX / oneDNN
    # / panel bf16), time them per row count at load and run the fastest, the times kept per
    # machine (model/linear/choice.py) | default: the first way, unmeasured | auto:
    # measure, unless the environment's MINIVLLM_KERNEL_CHOICE says default (the tests').
    kernel_choice: str = "auto"

    def __post_init__(self) -> None:
        if self.kernel_choice == "auto":
            self.kernel_choice = os.environ.get("MINIVLLM_KERNEL_CHOICE", "measure")
        if self.kernel_choice not in ("measure", "default"):
            raise _bad(self, "kernel_choice", "(--kernel-choice, or MINIVLLM_KERNEL_CHOICE) "
                                              "must be auto, measure or default")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16", "half", "float", "fp32"):
            raise _bad(self, "dtype", "must be one of auto, float32, bfloat16, float16")
        self._resolve_quantization()
        if self.generation_config not in ("auto", "vllm"):
            path = Path(self.generation_config).expanduser()
            if not (path / "generation_config.json").is_file() and not path.is_file():
                raise ValueError("generation_config (--generation-config) must be 'auto', "
                                 "'vllm' or a folder holding a generation_config.json, got "
                                 f"{self.generation_config!r}")
        self.override_generation_config = parse_override(
            self.override_generation_config,
            "override_generation_config (--override-generation-config)")
        self.pooler_config = parse_pooler_config(self.pooler_config,
                                                 "pooler_config (--pooler-config)")
        self._check_runner()

    def _resolve_quantization(self) -> None:
        if self.quantization not in (None, "none", "int8", "gguf"):
            raise _bad(self, "quantization", "(--quantization) must be none, int8 or gguf "
                                             "(unset: gguf for a .gguf file, else none)")
        gguf_file = _names_gguf_file(self.model)
        if self.quantization is None:
            self.quantization = "gguf" if gguf_file else None
        if self.quantization == "gguf" and not gguf_file:
            raise ValueError("quantization='gguf' runs a GGUF file's weight blocks: the model "
                             f"must be a .gguf file (or 'org/repo:file.gguf'), got {self.model!r}")
        if self.quantization == "int8" and self.dtype not in ("auto", "float32", "float",
                                                              "fp32"):
            raise ValueError("quantization='int8' keeps activations in float32: dtype must be "
                             f"auto or float32, got {self.dtype!r}")
        if self.quantization == "gguf" and self.dtype in ("float16", "half"):
            raise ValueError(
                f"dtype={self.dtype!r} with quantization='gguf' (a GGUF file's default): the "
                "blocks run with float32 activations (--dtype auto or float32) or the CPU's "
                "bf16 (--dtype bfloat16); --quantization none --dtype float16 dequantizes "
                "every weight to float16 instead")

    def _check_runner(self) -> None:
        if self.runner not in RUNNERS:
            raise _bad(self, "runner", f"(--runner) must be one of {', '.join(RUNNERS)}")
        if self.convert not in CONVERTS:
            raise _bad(self, "convert", f"(--convert) must be one of {', '.join(CONVERTS)} "
                                        "(minivllm converts to an embedding model only)")
        if self.runner == "generate" and self.convert == "embed":
            raise ValueError("convert='embed' (--convert embed) makes the model an embedding "
                             "model: it needs --runner pooling or auto, got --runner generate")
        if self.runner == "pooling" and self.convert == "none":
            # vLLM's rule for a generative model: pooling it needs the embed conversion.
            raise ValueError("runner='pooling' (--runner pooling) needs --convert embed or "
                             "auto: minivllm's models are generative, and pooling their "
                             "hidden states is the embed conversion; got --convert none")

    @property
    def runner_type(self) -> str:
        """Which requests the engine serves: "generate", "pooling", or "auto" (both, on one
        runner). vLLM resolves --runner auto by the model's architecture; every model here is
        generative and pools through model/pooler.py (the embed conversion), so auto serves
        both unless --convert says which: embed implies pooling, none implies generate."""
        if self.runner != "auto":
            return self.runner
        return {"auto": "auto", "embed": "pooling", "none": "generate"}[self.convert]

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


@dataclass
class CacheConfig:
    """The memory of the KV cache: its size, its swap space on the host and its dtype (the
    block size and prefix caching are the scheduler's, whose block manager uses them)."""

    num_kv_blocks: int | None = None  # explicit block count; overrides kv_cache_space
    # GiB of device memory for the KV cache. None: DEFAULT_KV_CACHE_SPACE, but no more than
    # max_num_seqs requests of max_model_len tokens can fill (EngineConfig.kv_cache_num_blocks).
    kv_cache_space: float | None = None
    swap_space: float = 4.0  # GiB of host memory for swapped-out blocks
    # auto: the model's dtype; bfloat16 (bf16): half the bytes per cached token for fp32
    # models (the attention kernels in model/kernels/ widen it to fp32 as they read); int8,
    # fp8 (= fp8_e4m3), fp8_e5m2: one byte per value and a scale per token and KV head
    # (model/kv_quant.py)
    kv_cache_dtype: str = "auto"
    # vLLM's KV offloading flags: "disk" keeps prefix-cache blocks evicted from memory as
    # files under kv_offloading_path (model/kv_disk.py), at most kv_offloading_size GiB, and
    # a restarted engine on the same model finds them there.
    kv_offloading_backend: str | None = None
    kv_offloading_path: str | None = None
    kv_offloading_size: float = 4.0
    # vLLM's prefill/decode disaggregation (core/kv_transfer.py): the disk tier's files on a
    # folder the instances share, written at once by a producer, read by a consumer (its
    # size is kv_offloading_size)
    kv_transfer_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise _bad(self, "num_kv_blocks", "must be >= 1")
        if self.kv_cache_space is not None and not self.kv_cache_space > 0:
            raise _bad(self, "kv_cache_space", "must be > 0")
        if self.swap_space < 0:
            raise _bad(self, "swap_space", "must be >= 0")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise _bad(self, "kv_cache_dtype", "must be one of " + ", ".join(KV_CACHE_DTYPES))
        if self.kv_offloading_backend not in (None, "disk"):
            raise _bad(self, "kv_offloading_backend",
                       "(--kv-offloading-backend) must be 'disk' (or unset)")
        if self.kv_offloading_backend and not self.kv_offloading_path:
            raise _bad(self, "kv_offloading_path", "(--kv-offloading-path) must name a folder "
                       "with --kv-offloading-backend disk")
        if self.kv_offloading_path and not self.kv_offloading_backend:
            raise _bad(self, "kv_offloading_backend", "(--kv-offloading-backend) must be "
                       "'disk' with --kv-offloading-path")
        if not self.kv_offloading_size > 0:
            raise _bad(self, "kv_offloading_size", "(--kv-offloading-size) must be > 0 (GiB)")
        self.kv_transfer_config = parse_kv_transfer_config(self.kv_transfer_config)
        if self.kv_transfer_config and self.kv_offloading_backend:
            raise _bad(self, "kv_offloading_backend", "(--kv-offloading-backend): not with "
                       "--kv-transfer-config, whose shared folder is the disk tier")

    @property
    def kv_transfer(self) -> KVTransferConfig | None:
        return KVTransferConfig.parse(self.kv_transfer_config)


@dataclass
class LoRAConfig:
    """LoRA adapters on the base model (lora/): vLLM's flags. How many adapters one step may
    run is the scheduler's max_loras."""

    enable_lora: bool = False
    max_lora_rank: int = 16  # adapters of a higher rank are refused
    max_cpu_loras: int | None = None  # adapters kept loaded (LRU beyond); None: max_loras

    def __post_init__(self) -> None:
        if self.max_lora_rank < 1:
            raise _bad(self, "max_lora_rank", "must be >= 1")
        if self.max_cpu_loras is not None and self.max_cpu_loras < 1:
            raise _bad(self, "max_cpu_loras", "must be >= 1")


@dataclass
class ParallelConfig:
    num_threads: int | None = None  # torch intra-op threads; None leaves torch's default


# EngineConfig's sections, in the order of the CLI flags.
SECTIONS: dict[str, type] = {"model_config": ModelConfig, "cache_config": CacheConfig,
                             "scheduler_config": SchedulerConfig,
                             "policy_config": PolicyConfig, "lora_config": LoRAConfig,
                             "parallel_config": ParallelConfig}
# SchedulerConfig fields that are not engine arguments: the engine sets them from the KV cache
# the model runner allocated.
_SET_BY_ENGINE = ("num_blocks", "num_swap_blocks")
# Engine arguments whose default is not their section's (whose defaults serve a scheduler
# built directly): None lets the engine decide, by the model (max_model_len) or by
# SchedulerConfig's rule (max_num_batched_tokens).
_ARG_DEFAULTS = {"max_num_batched_tokens": None, "max_model_len": None}


@dataclass(frozen=True)
class EngineArg:
    """One flat engine argument: the section that holds it, its default and its type."""

    name: str
    section: str
    default: Any
    type: Any


def _engine_args() -> dict[str, EngineArg]:
    args = {}
    for section, cls in SECTIONS.items():
        hints = get_type_hints(cls)
        for f in fields(cls):
            if f.name not in _SET_BY_ENGINE:
                default = _ARG_DEFAULTS.get(f.name, f.default)
                args[f.name] = EngineArg(f.name, section, default, hints[f.name])
    return args


ENGINE_ARGS: dict[str, EngineArg] = _engine_args()


@dataclass(init=False)
class EngineConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    policy_config: PolicyConfig
    lora_config: LoRAConfig
    parallel_config: ParallelConfig

    def __init__(self, **kwargs: Any) -> None:
        """The engine arguments by name (ENGINE_ARGS); unknown names are a TypeError that
        names them, a bad value a ValueError naming its argument."""
        unknown = sorted(set(kwargs) - set(ENGINE_ARGS))
        if unknown:
            raise TypeError(f"unknown engine argument(s): {', '.join(unknown)}")
        given: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
        for name, value in kwargs.items():
            given[ENGINE_ARGS[name].section][name] = value
        self.model_config = ModelConfig(**given["model_config"])
        self.cache_config = CacheConfig(**given["cache_config"])
        self.scheduler_config = SchedulerConfig(**{**_ARG_DEFAULTS, **given["scheduler_config"]})
        self.policy_config = PolicyConfig(**given["policy_config"])
        self.lora_config = LoRAConfig(**given["lora_config"])
        self.parallel_config = ParallelConfig(**given["parallel_config"])
        scheduler = self.scheduler_config
        self._check_lora()
        if self.cache_config.kv_transfer_config and not scheduler.enable_prefix_caching:
            raise ValueError("kv_transfer_config (--kv-transfer-config): the transferred blocks "
                             "are found through the prefix cache: drop "
                             "--no-enable-prefix-caching")
        if not scheduler.enable_chunked_prefill and scheduler.max_model_len is not None:
            if scheduler.max_num_batched_tokens < scheduler.max_model_len:
                raise ValueError(
                    f"max_num_batched_tokens ({scheduler.max_num_batched_tokens}) must be >= "
                    f"max_model_len ({scheduler.max_model_len}) when chunked prefill is disabled"
                )

    def _check_lora(self) -> None:
        lora, scheduler = self.lora_config, self.scheduler_config
        if lora.max_cpu_loras is None:
            lora.max_cpu_loras = scheduler.max_loras
        if lora.max_cpu_loras < scheduler.max_loras:
            raise ValueError(f"max_cpu_loras ({lora.max_cpu_loras}) must be >= max_loras "
                             f"({scheduler.max_loras}): a step's adapters stay loaded")
        spec = scheduler.speculative_config
        if lora.enable_lora and spec and spec["method"] == "draft_model":
            raise ValueError("enable_lora: speculative_config's draft_model method does not "
                             "run LoRA adapters (ngram does)")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        return cls(**kwargs)

    def to_kwargs(self) -> dict[str, Any]:
        """The engine arguments, flat (from_kwargs of them builds an equal config)."""
        return {name: getattr(self, name) for name in ENGINE_ARGS}

    def __getattr__(self, name: str) -> Any:
        """An engine argument read by its flat name, from the section that holds it."""
        arg = ENGINE_ARGS.get(name)
        section = self.__dict__.get(arg.section) if arg else None
        if section is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(section, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # A flat name set here would shadow its section's value, which the engine reads.
        if name in ENGINE_ARGS:
            raise AttributeError(f"set {name} on config.{ENGINE_ARGS[name].section}")
        object.__setattr__(self, name, value)

    @property
    def model_name(self) -> str:
        return self.model_config.model_name

    def kv_cache_num_blocks(self, block_bytes: int, max_model_len: int) -> int:
        """How many KV blocks of `block_bytes` the cache gets: num_kv_blocks, else what
        kv_cache_space holds. By default, 4 GiB but at most what max_num_seqs full-length
        requests can fill at once: a tiny model's 4 GiB would be millions of tokens, so the
        KV usage a newcomer watches would read 0.0% under any load, and the memory beyond
        that bound could only ever hold evicted prefix-cache blocks."""
        cache, scheduler = self.cache_config, self.scheduler_config
        if cache.num_kv_blocks is not None:
            return cache.num_kv_blocks
        space = cache.kv_cache_space if cache.kv_cache_space is not None \
            else DEFAULT_KV_CACHE_SPACE
        blocks = int(space * (1 << 30) // block_bytes)
        if cache.kv_cache_space is None:
            blocks = min(blocks, scheduler.max_num_seqs
                         * -(-max_model_len // scheduler.block_size))
        return max(1, blocks)
