"""EngineConfig: the one configuration object, built once and validated at construction.

Field names follow vLLM's keyword arguments; the CLI flags are the same names with dashes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

DEMO_MODEL_NAME = "minivllm-demo"
DEFAULT_KV_CACHE_SPACE = 4.0  # GiB; vLLM's CPU build also defaults to a fixed 4 GiB


@dataclass
class EngineConfig:
    model: str = DEMO_MODEL_NAME
    tokenizer: str | None = None
    served_model_name: str | None = None
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    # None | int8: W8A8 linear layers, quantized at load (model/kernels/linear_int8.py)
    quantization: str | None = None
    device: str = "auto"  # auto | cpu | cuda
    seed: int = 0
    revision: str | None = None
    # KV cache
    block_size: int = 16
    num_kv_blocks: int | None = None  # explicit block count; overrides kv_cache_space
    # GiB of device memory for the KV cache. None: DEFAULT_KV_CACHE_SPACE, but no more than
    # max_num_seqs requests of max_model_len tokens can fill (see kv_cache_num_blocks).
    kv_cache_space: float | None = None
    swap_space: float = 4.0  # GiB of host memory for swapped-out blocks
    # auto: the model's dtype; bfloat16 (bf16): half the bytes per cached token for fp32
    # models (model/kernels/paged_attention.c widens it to fp32 as it reads)
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    # Scheduling
    max_num_seqs: int = 256
    # Tokens per step. None: 512 with chunked prefill (a step that carries a prefill chunk
    # then costs ~0.3 s on a 135M model here, which bounds how long decodes wait behind it;
    # measured in docs/performance.md), else max(2048, max_model_len).
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"
    # What SJF (and any policy that ranks by output length) predicts it with: mean | oracle |
    # bucket | probe (core/length_predictor.py).
    length_predictor: str = "mean"
    # A JSON line per finished request (prompt tokens, predicted and true output length):
    # what bench reads to report the predictor's Kendall tau and error.
    length_prediction_log: str | None = None
    preemption_mode: str | None = None  # None: vLLM V0's rule (swap if >1 seq, else recompute)
    priority_aging_s: float = 10.0  # waiting this long improves effective priority by one level
    active_preemption: bool = False
    min_run_quantum: int = 8  # steps a request runs before it may be actively preempted
    preemption_victim: str = "lowest_rank"  # lowest_rank | latest_arrival | least_work_done
    # Options of the policies that take them (core/policies/): vtc's token weights "W_P,W_Q";
    # edf's action on a request past its deadline, and the deadlines (ms after arrival) of
    # requests that give none; mlfq's first quantum (decode iterations).
    vtc_weights: str = "1,2"
    edf_action: str = "shed"
    ttft_slo_ms: float | None = None
    e2e_slo_ms: float | None = None
    mlfq_base_quantum: int = 4
    max_num_waiting_requests: int | None = None
    max_num_waiting_tokens: int | None = None
    request_timeout: float | None = None  # seconds a request may wait before it fails
    max_logprobs: int = 20
    num_threads: int | None = None  # torch intra-op threads; None leaves torch's default
    # Sampling defaults (engine/generation_defaults.py): "auto" reads the model's
    # generation_config.json, "vllm" ignores it, or a folder holding a generation_config.json.
    generation_config: str = "auto"
    override_generation_config: dict[str, Any] | None = None  # e.g. {"temperature": 0.5}

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{name} {why}, got {getattr(self, name)!r}")

        if self.dtype not in ("auto", "float32", "bfloat16", "float16", "half", "float", "fp32"):
            raise bad("dtype", "must be one of auto, float32, bfloat16, float16")
        if self.quantization not in (None, "int8"):
            raise bad("quantization", "must be int8 (or unset for none)")
        if self.quantization and self.dtype not in ("auto", "float32", "float", "fp32"):
            raise ValueError(f"quantization={self.quantization!r} keeps activations in "
                             f"float32: dtype must be auto or float32, got {self.dtype!r}")
        if self.kv_cache_dtype not in ("auto", "bfloat16", "bf16"):
            raise bad("kv_cache_dtype", "must be auto or bfloat16 (bf16)")
        if self.block_size < 1 or self.block_size > 256:
            raise bad("block_size", "must be in [1, 256]")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise bad("num_kv_blocks", "must be >= 1")
        if self.kv_cache_space is not None and not self.kv_cache_space > 0:
            raise bad("kv_cache_space", "must be > 0")
        if self.swap_space < 0:
            raise bad("swap_space", "must be >= 0")
        if self.max_num_seqs < 1:
            raise bad("max_num_seqs", "must be >= 1")
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = (512 if self.enable_chunked_prefill
                                           else max(2048, self.max_model_len or 0))
        if self.max_num_batched_tokens < 1:
            raise bad("max_num_batched_tokens", "must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise bad("max_model_len", "must be >= 1")
        if self.preemption_mode not in (None, "recompute", "swap"):
            raise bad("preemption_mode", "must be recompute or swap")
        from minivllm.core.length_predictor import LENGTH_PREDICTORS

        if self.length_predictor not in LENGTH_PREDICTORS:
            raise bad("length_predictor", f"must be one of {', '.join(LENGTH_PREDICTORS)}")
        if self.priority_aging_s <= 0:
            raise bad("priority_aging_s", "must be > 0")
        if self.min_run_quantum < 0:
            raise bad("min_run_quantum", "must be >= 0")
        from minivllm.core.policies.edf import EDF_ACTIONS
        from minivllm.core.policies.vtc import parse_vtc_weights
        from minivllm.core.preemption import VICTIM_RULES

        if self.preemption_victim not in VICTIM_RULES:
            raise bad("preemption_victim", f"must be one of {', '.join(VICTIM_RULES)}")
        parse_vtc_weights(self.vtc_weights)  # its error names the setting
        if self.edf_action not in EDF_ACTIONS:
            raise bad("edf_action", "must be shed or deprioritize")
        for name in ("ttft_slo_ms", "e2e_slo_ms"):
            if getattr(self, name) is not None and not 0 < getattr(self, name) < float("inf"):
                raise bad(name, "must be > 0 (milliseconds)")
        if self.mlfq_base_quantum < 1:
            raise bad("mlfq_base_quantum", "must be >= 1")
        for name in ("max_num_waiting_requests", "max_num_waiting_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise bad(name, "must be >= 1")
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise bad("request_timeout", "must be > 0")
        if self.generation_config not in ("auto", "vllm"):
            path = Path(self.generation_config).expanduser()
            if not (path / "generation_config.json").is_file() and not path.is_file():
                raise ValueError("generation_config (--generation-config) must be 'auto', "
                                 "'vllm' or a folder holding a generation_config.json, got "
                                 f"{self.generation_config!r}")
        from minivllm.engine.generation_defaults import parse_override

        self.override_generation_config = parse_override(
            self.override_generation_config,
            "override_generation_config (--override-generation-config)")
        if not self.enable_chunked_prefill and self.max_model_len is not None:
            if self.max_num_batched_tokens < self.max_model_len:
                raise ValueError(
                    f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                    f"max_model_len ({self.max_model_len}) when chunked prefill is disabled"
                )

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Build from keyword arguments; unknown names are an error that names them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine argument(s): {', '.join(unknown)}")
        return cls(**kwargs)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    def kv_cache_num_blocks(self, block_bytes: int, max_model_len: int) -> int:
        """How many KV blocks of `block_bytes` the cache gets: num_kv_blocks, else what
        kv_cache_space holds. By default, 4 GiB but at most what max_num_seqs full-length
        requests can fill at once: a tiny model's 4 GiB would be millions of tokens, so the
        KV usage a newcomer watches would read 0.0% under any load, and the memory beyond
        that bound could only ever hold evicted prefix-cache blocks."""
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        space = self.kv_cache_space if self.kv_cache_space is not None \
            else DEFAULT_KV_CACHE_SPACE
        blocks = int(space * (1 << 30) // block_bytes)
        if self.kv_cache_space is None:
            blocks = min(blocks, self.max_num_seqs * -(-max_model_len // self.block_size))
        return max(1, blocks)
