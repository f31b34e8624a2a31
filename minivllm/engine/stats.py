"""Plain statistics made by the engine each step; loggers (engine/stat_loggers.py) only format them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SchedulerStats:
    """A snapshot of queues and KV cache after a step. Counters are cumulative."""

    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_total_blocks: int = 0
    num_free_blocks: int = 0
    kv_cache_usage: float = 0.0  # 0-1
    num_total_swap_blocks: int = 0
    num_free_swap_blocks: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens served from the cache
    # The recompute tax: tokens computed again after recompute preemption, of all computed.
    num_recomputed_tokens: int = 0
    num_computed_tokens: int = 0
    # Deadline policies (edf): requests shed for a missed deadline, and ranked last for it.
    num_requests_shed: int = 0
    num_requests_deprioritized: int = 0
    # Speculative decoding (core/speculative.py's SpecDecodingStats): verifications, draft
    # tokens, accepted ones, and accepted ones by their position in the draft.
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_num_accepted_tokens_per_pos: tuple[int, ...] = ()
    # LoRA: requests by adapter name, running and waiting now, and received (cumulative).
    max_lora: int = 0
    running_lora_adapters: dict[str, int] = field(default_factory=dict)
    waiting_lora_adapters: dict[str, int] = field(default_factory=dict)
    lora_requests_received: dict[str, int] = field(default_factory=dict)

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


@dataclass
class FinishedRequestStats:
    finish_reason: str
    num_prompt_tokens: int
    num_generation_tokens: int
    e2e_latency: float  # seconds, arrival -> finished
    queue_time: float  # arrival -> first scheduled
    prefill_time: float  # first scheduled -> first token
    decode_time: float  # first token -> finished


@dataclass
class IterationStats:
    """What one engine step did."""

    timestamp: float
    num_prompt_tokens: int = 0  # prompt tokens computed (not served from cache) this step
    num_generation_tokens: int = 0
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
