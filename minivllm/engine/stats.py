"""Plain statistics made by the engine each step; loggers (engine/stat_loggers.py) only format them.
The scheduler's own snapshot, SchedulerStats, is core/scheduler_stats.py's."""

from __future__ import annotations

from dataclasses import dataclass, field


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
