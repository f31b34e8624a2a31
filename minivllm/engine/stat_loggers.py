"""Stat loggers: they only format the engine's SchedulerStats / IterationStats (vLLM's loggers.py).

The engine calls `record()` after every step; the async engine calls `log()` every
--log-interval seconds from the same thread, so neither logger needs a lock of its own.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Gauge

from minivllm.core.lifecycle import TraceSample
from minivllm.core.scheduler_stats import SchedulerStats, add_per_position
from minivllm.engine.metrics_table import METRICS, MODEL, TOKEN_BUCKETS, Metric, token_buckets
from minivllm.engine.stats import IterationStats

logger = logging.getLogger(__name__)


def spec_decoding_line(now: SchedulerStats, before: SchedulerStats, elapsed: float) -> str | None:
    """vLLM's `SpecDecoding metrics:` line over an interval (None: no drafts in it)."""
    drafts = now.spec_num_drafts - before.spec_num_drafts
    if drafts <= 0:
        return None
    drafted = now.spec_num_draft_tokens - before.spec_num_draft_tokens
    accepted = now.spec_num_accepted_tokens - before.spec_num_accepted_tokens
    per_pos = add_per_position(now.spec_num_accepted_tokens_per_pos,
                               before.spec_num_accepted_tokens_per_pos, -1)
    rates = ", ".join(f"{n / drafts:.3f}" for n in per_pos)
    return (f"SpecDecoding metrics: Mean acceptance length: {1 + accepted / drafts:.2f}, "
            f"Accepted throughput: {accepted / elapsed:.2f} tokens/s, Drafted throughput: "
            f"{drafted / elapsed:.2f} tokens/s, Accepted: {accepted} tokens, Drafted: "
            f"{drafted} tokens, Per-position acceptance rate: {rates}, Avg Draft acceptance "
            f"rate: {100 * accepted / max(drafted, 1):.1f}%")


class StatLoggerBase:
    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats,
               engine_idx: int = 0) -> None:
        """One step of engine `engine_idx` (a data-parallel replica; 0 with one engine)."""
        raise NotImplementedError

    def log(self) -> None:
        """Periodic hook (every --log-interval seconds); loggers that only record ignore it."""

    def record_rejected(self, reason: str, engine_idx: int = 0) -> None:
        """A request turned away before it produced anything (REJECT_REASONS), by engine
        `engine_idx`; called where record() is."""

    def record_trace(self, sample: TraceSample, engine_idx: int = 0) -> None:
        """Request lifecycles and the block map (core/lifecycle.py), while tracing is on;
        called where record() is."""


class LoggingStatLogger(StatLoggerBase):
    """One INFO line per interval while busy, in vLLM's words; quiet when idle."""

    def __init__(self, clock=time.monotonic, prefix: str = "") -> None:
        self._clock = clock
        self._prefix = prefix  # data parallel: "Engine 000: ", "Total (2 engines): "
        self._last_log_time = clock()
        self._num_prompt_tokens = 0
        self._num_generation_tokens = 0
        self._last_stats = SchedulerStats()
        self._logged_stats = SchedulerStats()  # at the last line: the spec-decoding deltas
        self._last_was_busy = False

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats,
               engine_idx: int = 0) -> None:
        self._num_prompt_tokens += iteration_stats.num_prompt_tokens
        self._num_generation_tokens += iteration_stats.num_generation_tokens
        self._last_stats = scheduler_stats

    def log(self) -> None:
        now = self._clock()
        elapsed = max(now - self._last_log_time, 1e-9)
        prompt_throughput = self._num_prompt_tokens / elapsed
        generation_throughput = self._num_generation_tokens / elapsed
        self._last_log_time = now
        self._num_prompt_tokens = self._num_generation_tokens = 0
        s = self._last_stats
        busy = bool(prompt_throughput or generation_throughput or s.num_running or s.num_waiting
                    or s.num_swapped)
        # One line after the load stops (so the zeros are seen), then silence while idle.
        if not busy and not self._last_was_busy:
            return
        self._last_was_busy = busy
        logger.info(
            "%sAvg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
            "Running: %d reqs, Swapped: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, "
            "Prefix cache hit rate: %.1f%%", self._prefix,
            prompt_throughput, generation_throughput, s.num_running, s.num_swapped,
            s.num_waiting, s.kv_cache_usage * 100, s.prefix_cache_hit_rate * 100,
        )
        spec_line = spec_decoding_line(s, self._logged_stats, elapsed)
        if spec_line is not None:
            logger.info("%s%s", self._prefix, spec_line)
        self._logged_stats = s


class PrometheusStatLogger(StatLoggerBase):
    """vLLM's metric names with a model_name label, in a registry of its own; each metric of
    metrics_table.METRICS is the attribute its row names."""

    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.registry = CollectorRegistry()
        self._model_name = model_name
        for metric in METRICS:
            setattr(self, metric.attr, self._declare(metric, max_model_len))
        # SchedulerStats counters are cumulative; Prometheus counters take increments.
        self._last = SchedulerStats()

    def _declare(self, metric: Metric, max_model_len: int):
        """The metric in this registry: the model's series where model_name is its only
        label, else the labelled metric with its `zeros` series exported."""
        buckets = metric.buckets
        extra = {} if buckets is None else {
            "buckets": token_buckets(max_model_len) if buckets == TOKEN_BUCKETS else buckets}
        declared = metric.kind(metric.name, metric.help, list(metric.labels),
                               registry=self.registry, **extra)
        if metric.labels == MODEL:
            return declared.labels(self._model_name)
        for value in metric.zeros:
            declared.labels(self._model_name, value)
        return declared

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats,
               engine_idx: int = 0) -> None:
        s = scheduler_stats
        for metric in METRICS:
            if metric.mirrors_stats:
                self._mirror(metric, s)
        used_swap = s.num_total_swap_blocks - s.num_free_swap_blocks
        self.cpu_cache_usage.set(used_swap / s.num_total_swap_blocks if s.num_total_swap_blocks
                                 else 0.0)
        per_pos = add_per_position(s.spec_num_accepted_tokens_per_pos,
                                   self._last.spec_num_accepted_tokens_per_pos, -1)
        for position, delta in enumerate(per_pos):
            if delta > 0:
                self.spec_per_pos.labels(self._model_name, str(position)).inc(delta)
        if s.lora_requests_received:
            self._record_lora(s)
        self._last = s

        it = iteration_stats
        self.prompt_tokens.inc(it.num_prompt_tokens)
        self.generation_tokens.inc(it.num_generation_tokens)
        for ttft in it.time_to_first_tokens:
            self.ttft.observe(ttft)
        for itl in it.inter_token_latencies:
            self.itl.observe(itl)
        for req in it.finished_requests:
            self.request_success.labels(self._model_name, req.finish_reason).inc()
            self.e2e.observe(req.e2e_latency)
            self.queue_time.observe(req.queue_time)
            self.prefill_time.observe(req.prefill_time)
            self.decode_time.observe(req.decode_time)
            self.request_prompt_tokens.observe(req.num_prompt_tokens)
            self.request_generation_tokens.observe(req.num_generation_tokens)

    def _mirror(self, metric: Metric, s: SchedulerStats) -> None:
        """A gauge to the SchedulerStats field of its name; a counter by the field's growth."""
        value = getattr(s, metric.attr)
        if metric.kind is Gauge:
            getattr(self, metric.attr).set(value)
            return
        delta = value - getattr(self._last, metric.attr)
        if delta > 0:
            getattr(self, metric.attr).inc(delta)

    def _record_lora(self, s: SchedulerStats) -> None:
        self.lora_info.clear()  # one series: the adapters now
        self.lora_info.labels(str(s.max_lora), ",".join(sorted(s.waiting_lora_adapters)),
                              ",".join(sorted(s.running_lora_adapters))).set(time.time())
        for gauge, counts in ((self.lora_running, s.running_lora_adapters),
                              (self.lora_waiting, s.waiting_lora_adapters)):
            for name in s.lora_requests_received:
                gauge.labels(self._model_name, name).set(counts.get(name, 0))
        for name, count in s.lora_requests_received.items():
            delta = count - self._last.lora_requests_received.get(name, 0)
            if delta > 0:
                self.lora_received.labels(self._model_name, name).inc(delta)

    def record_rejected(self, reason: str, engine_idx: int = 0) -> None:
        self.requests_rejected.labels(self._model_name, reason).inc()
