"""Stat loggers: they only format the engine's SchedulerStats / IterationStats (vLLM's loggers.py).

The engine calls `record()` after every step; the async engine calls `log()` every
--log-interval seconds from the same thread, so neither logger needs a lock of its own.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from minivllm.core.lifecycle import TraceSample
from minivllm.core.scheduler_stats import SchedulerStats, add_per_position
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


# vLLM's histogram buckets, in seconds, with a few finer ones for fast CPU steps.
_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
_ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
_REQUEST_TIME_BUCKETS = [0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                         30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
FINISH_REASONS = ("stop", "length", "abort")
# EngineOverloadedError.reason, plus the queue timeout.
REJECT_REASONS = ("max_num_waiting_requests", "max_num_waiting_tokens", "request_timeout",
                  "shutdown")


def token_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's build_1_2_5_buckets)."""
    buckets, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


class PrometheusStatLogger(StatLoggerBase):
    """vLLM's metric names with a model_name label, in a registry of its own."""

    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r).labels(model_name)

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(model_name)

        self.num_running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.num_waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.num_swapped = gauge("vllm:num_requests_swapped", "Requests swapped out to host memory.")
        self.kv_cache_usage = gauge("vllm:kv_cache_usage_perc",
                                    "KV cache usage; 1 means 100 percent.")
        self.cpu_cache_usage = gauge("vllm:cpu_cache_usage_perc",
                                     "Swap (host) KV block usage; 1 means 100 percent.")
        self.prefix_cache_queries = counter("vllm:prefix_cache_queries",
                                            "Prompt tokens looked up in the prefix cache.")
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits",
                                         "Prompt tokens served from the prefix cache.")
        self.num_preemptions = counter("vllm:num_preemptions", "Preemptions (swap or recompute).")
        # The disk tier: vLLM names hits from outside the device's prefix cache "external"
        self.kv_disk_hits = counter("vllm:external_prefix_cache_hits",
                                    "Prompt tokens of prefix-cache hits loaded from the disk "
                                    "tier (--kv-offloading-backend disk).")
        self.kv_disk_bytes_read = counter("minivllm:kv_disk_bytes_read",
                                          "Bytes of KV blocks read from the disk tier.")
        self.kv_disk_bytes_written = counter("minivllm:kv_disk_bytes_written",
                                             "Bytes of KV blocks written to the disk tier.")
        self.kv_disk_evictions = counter("minivllm:kv_disk_evictions",
                                         "Blocks deleted from the disk tier for room (LRU).")
        self.kv_disk_corrupt = counter("minivllm:kv_disk_corrupt",
                                       "Disk tier blocks that failed their check (deleted, "
                                       "recomputed).")
        self.kv_disk_blocks = gauge("minivllm:kv_disk_blocks", "Block files in the disk tier.")
        self.kv_disk_used_bytes = gauge("minivllm:kv_disk_used_bytes",
                                        "Bytes the disk tier's block files take.")
        self.kv_disk_capacity_bytes = gauge("minivllm:kv_disk_capacity_bytes",
                                            "The disk tier's size (--kv-offloading-size).")
        self.num_recomputed_tokens = counter(
            "minivllm:num_recomputed_tokens",
            "Tokens computed again after recompute preemption (the recompute tax's numerator).")
        self.num_computed_tokens = counter(
            "minivllm:num_computed_tokens",
            "Tokens computed by the model, recomputed ones included (prefix-cache hits not).")
        self.num_requests_shed = counter(
            "minivllm:num_requests_shed",
            "Requests finished with an error for missing their deadline while queued (edf).")
        self.num_requests_deprioritized = counter(
            "minivllm:num_requests_deprioritized",
            "Requests ranked last for missing their deadline (edf).")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.request_success = Counter("vllm:request_success", "Finished requests by reason.",
                                       labels + ["finished_reason"], registry=r)
        for reason in FINISH_REASONS:  # export zeros before the first request finishes
            self.request_success.labels(model_name, reason)
        self.requests_rejected = Counter(
            "vllm:num_requests_rejected", "Requests turned away before any output, by reason.",
            labels + ["reason"], registry=r)
        for reason in REJECT_REASONS:
            self.requests_rejected.labels(model_name, reason)
        self._model_name = model_name
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token.",
                              _TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between output tokens.",
                             _ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to finish.",
                             _REQUEST_TIME_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds",
                                    "Arrival to first scheduled.", _REQUEST_TIME_BUCKETS)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds",
                                      "First scheduled to first token.", _REQUEST_TIME_BUCKETS)
        self.decode_time = histogram("vllm:request_decode_time_seconds",
                                     "First token to finish.", _REQUEST_TIME_BUCKETS)
        buckets = token_buckets(max_model_len)
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens",
                                               "Prompt length of finished requests.", buckets)
        self.request_generation_tokens = histogram("vllm:request_generation_tokens",
                                                   "Tokens generated by finished requests.", buckets)
        self.spec_num_drafts = counter("vllm:spec_decode_num_drafts",
                                       "Verifications of draft tokens (speculative decoding).")
        self.spec_num_draft_tokens = counter("vllm:spec_decode_num_draft_tokens",
                                             "Draft tokens proposed.")
        self.spec_num_accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens",
                                                "Draft tokens accepted.")
        self.spec_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                    "Draft tokens accepted, by their position in the draft.",
                                    labels + ["position"], registry=r)
        # LoRA: vLLM's info gauge (its labels name the adapters, its value is the time), and
        # requests per adapter.
        self.lora_info = Gauge("vllm:lora_requests_info", "Running stats on LoRA requests.",
                               ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                               registry=r)
        self.lora_running = Gauge("minivllm:lora_requests_running",
                                  "Running requests, by LoRA adapter.", labels + ["lora_name"],
                                  registry=r)
        self.lora_waiting = Gauge("minivllm:lora_requests_waiting",
                                  "Waiting requests, by LoRA adapter.", labels + ["lora_name"],
                                  registry=r)
        self.lora_received = Counter("minivllm:lora_requests",
                                     "Requests received, by LoRA adapter.",
                                     labels + ["lora_name"], registry=r)
        # SchedulerStats counters are cumulative; Prometheus counters take increments.
        self._last = SchedulerStats()

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats,
               engine_idx: int = 0) -> None:
        s = scheduler_stats
        self.num_running.set(s.num_running)
        self.num_waiting.set(s.num_waiting)
        self.num_swapped.set(s.num_swapped)
        self.kv_cache_usage.set(s.kv_cache_usage)
        self.kv_disk_blocks.set(s.kv_disk_blocks)
        self.kv_disk_used_bytes.set(s.kv_disk_used_bytes)
        self.kv_disk_capacity_bytes.set(s.kv_disk_capacity_bytes)
        used_swap = s.num_total_swap_blocks - s.num_free_swap_blocks
        self.cpu_cache_usage.set(used_swap / s.num_total_swap_blocks if s.num_total_swap_blocks
                                 else 0.0)
        for name in ("prefix_cache_queries", "prefix_cache_hits", "kv_disk_hits",
                     "kv_disk_bytes_read", "kv_disk_bytes_written", "kv_disk_evictions",
                     "kv_disk_corrupt", "num_preemptions",
                     "num_recomputed_tokens", "num_computed_tokens", "num_requests_shed",
                     "num_requests_deprioritized", "spec_num_drafts", "spec_num_draft_tokens",
                     "spec_num_accepted_tokens"):
            delta = getattr(s, name) - getattr(self._last, name)
            if delta > 0:
                getattr(self, name).inc(delta)
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
