"""SchedulerConfig: the scheduler's KV blocks, step budget, preemption and admission limits,
checked once when it is made (vLLM keeps its scheduler config apart from the scheduler too)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minivllm.core.preemption import victim_rule
from minivllm.core.speculative import parse_speculative_config


@dataclass
class SchedulerConfig:
    """The scheduler's KV blocks, step budget, preemption and admission limits. As part of
    the engine's config (config.py) its fields are engine arguments of the same names,
    except num_blocks and num_swap_blocks: the engine sets those from the cache the model
    runner allocated, and max_model_len from the model when it is not given."""

    num_blocks: int = 0
    block_size: int = 16
    max_num_seqs: int = 256
    # Tokens per step. None: 512 with chunked prefill (a step that carries a prefill chunk
    # then costs ~0.3 s on a 135M model here, which bounds how long decodes wait behind it;
    # measured in docs/performance.md), else max(2048, max_model_len).
    max_num_batched_tokens: int | None = 2048
    max_model_len: int | None = 2048  # None: not known yet (the model's, set by the engine)
    num_swap_blocks: int = 0
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    # vLLM's: with chunked prefill, a request computes at most this many tokens a step (0:
    # no cap), so that a long prompt leaves room in each step for the other prompts and the
    # decodes instead of filling the budget alone. As in vLLM, a request alone in the
    # engine is not capped (there is nobody to leave room for); with the adaptive flag the
    # cap is raised to a fair share of the budget, max_num_batched_tokens / requests.
    long_prefill_token_threshold: int = 0
    long_prefill_token_threshold_adaptive: bool = False
    # vLLM V0's: with chunked prefill, at most this many requests compute prompt tokens in
    # one step (None: no limit), and of those at most max_long_partial_prefills have more
    # than long_prefill_token_threshold tokens left to prefill, so short prompts pass
    # long ones waiting behind the ones already prefilling.
    max_num_partial_prefills: int | None = None
    max_long_partial_prefills: int | None = None
    # With chunked prefill, pack each step that carries decodes so its predicted time stays
    # within this (core/step_cost.py learns the prediction from the steps run): a step's
    # time is the TPOT of each of its decodes, and a prefill chunk that would pass the
    # target is cut to what fits, never below one block for the step's first prefill, so
    # prompts still start every step. None: off (steps fill max_num_batched_tokens).
    target_tpot_ms: float | None = None
    preemption_mode: str | None = None  # None: swap multi-sequence requests, else recompute
    active_preemption: bool = False
    min_run_quantum: int = 8  # steps a request runs before it may be actively preempted
    preemption_victim: str = "lowest_rank"  # core/preemption.py's VICTIM_RULES
    # Admission: the engine core turns requests away at these queue bounds, and fails those
    # that waited request_timeout seconds without being scheduled.
    max_num_waiting_requests: int | None = None
    max_num_waiting_tokens: int | None = None
    request_timeout: float | None = None
    # LoRA (--enable-lora): the most adapters the requests of one step may use; a waiting
    # request of another adapter waits until one of the running adapters has no request.
    max_loras: int = 1
    # vLLM's --speculative-config (core/speculative.py): {"method": "ngram",
    # "num_speculative_tokens": 3, ...}; None: no speculative decoding.
    speculative_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{name} {why}, got {getattr(self, name)!r}")

        if self.block_size < 1 or self.block_size > 256:
            raise bad("block_size", "must be in [1, 256]")
        if self.max_num_seqs < 1:
            raise bad("max_num_seqs", "must be >= 1")
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = (512 if self.enable_chunked_prefill
                                           else max(2048, self.max_model_len or 0))
        if self.max_num_batched_tokens < 1:
            raise bad("max_num_batched_tokens", "must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise bad("max_model_len", "must be >= 1")
        if self.long_prefill_token_threshold < 0:
            raise bad("long_prefill_token_threshold", "must be >= 0 (0: no cap)")
        if self.long_prefill_token_threshold and not self.enable_chunked_prefill:
            raise bad("long_prefill_token_threshold", "needs chunked prefill (it caps chunks)")
        if self.long_prefill_token_threshold_adaptive and not self.long_prefill_token_threshold:
            raise bad("long_prefill_token_threshold_adaptive",
                      "needs long_prefill_token_threshold > 0 (it raises that cap)")
        for name in ("max_num_partial_prefills", "max_long_partial_prefills"):
            if getattr(self, name) is None:
                continue
            if getattr(self, name) < 1:
                raise bad(name, "must be >= 1 (None: no limit)")
            if not self.enable_chunked_prefill:
                raise bad(name, "needs chunked prefill (it limits partial prefills)")
        if self.max_long_partial_prefills is not None:
            if not self.long_prefill_token_threshold:
                raise bad("max_long_partial_prefills",
                          "needs long_prefill_token_threshold > 0 (what counts as long)")
            if self.max_long_partial_prefills > (self.max_num_partial_prefills or 1 << 30):
                raise bad("max_long_partial_prefills", "must be <= max_num_partial_prefills")
        if self.target_tpot_ms is not None:
            if not self.target_tpot_ms > 0:
                raise bad("target_tpot_ms", "must be > 0 (None: off)")
            if not self.enable_chunked_prefill:
                raise bad("target_tpot_ms", "needs chunked prefill (it cuts prefill chunks)")
        if self.preemption_mode not in (None, "recompute", "swap"):
            raise bad("preemption_mode", "must be recompute or swap")
        if self.min_run_quantum < 0:
            raise bad("min_run_quantum", "must be >= 0")
        victim_rule(self.preemption_victim)  # a ValueError naming the known rules
        for name in ("max_num_waiting_requests", "max_num_waiting_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise bad(name, "must be >= 1")
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise bad("request_timeout", "must be > 0")
        if self.max_loras < 1:
            raise bad("max_loras", "must be >= 1")
        self.speculative_config = parse_speculative_config(self.speculative_config)
