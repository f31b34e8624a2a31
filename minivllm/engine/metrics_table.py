"""The Prometheus metrics the server exports, as data: one row per metric — the
PrometheusStatLogger attribute that holds it, its type, name, help text and labels
(stat_loggers.py builds them). Users and tests scrape these names: change none of them.

Rows are in the order /metrics lists them.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram

MODEL = ("model_name",)

# vLLM's histogram buckets, in seconds, with a few finer ones for fast CPU steps.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_TIME_BUCKETS = [0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
                        20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
# Token counts: 1, 2, 5, 10, ... up to the model's context length (token_buckets).
TOKEN_BUCKETS = "tokens"

FINISH_REASONS = ("stop", "length", "abort")
# EngineOverloadedError.reason, plus the queue timeout.
REJECT_REASONS = ("max_num_waiting_requests", "max_num_waiting_tokens", "request_timeout",
                  "shutdown")


@dataclass(frozen=True)
class Metric:
    attr: str  # the PrometheusStatLogger attribute
    kind: type  # Gauge, Counter or Histogram
    name: str
    help: str
    # Only model_name: the attribute is the model's series; more: the labelled metric.
    labels: tuple[str, ...] = MODEL
    buckets: list[float] | str | None = None  # histograms
    zeros: tuple[str, ...] = ()  # the extra label's values exported before any is seen
    # A SchedulerStats field of the same name: a gauge is set to it, a counter grows as it
    # grows (those are cumulative; Prometheus counters take increments).
    mirrors_stats: bool = False


def _gauge(attr: str, name: str, help: str, **kw) -> Metric:
    return Metric(attr, Gauge, name, help, **kw)


def _counter(attr: str, name: str, help: str, **kw) -> Metric:
    return Metric(attr, Counter, name, help, **kw)


def _histogram(attr: str, name: str, help: str, buckets, **kw) -> Metric:
    return Metric(attr, Histogram, name, help, buckets=buckets, **kw)


METRICS = (
    _gauge("num_running", "vllm:num_requests_running", "Requests in the running batch.",
           mirrors_stats=True),
    _gauge("num_waiting", "vllm:num_requests_waiting", "Requests waiting to be scheduled.",
           mirrors_stats=True),
    _gauge("num_swapped", "vllm:num_requests_swapped", "Requests swapped out to host memory.",
           mirrors_stats=True),
    _gauge("kv_cache_usage", "vllm:kv_cache_usage_perc", "KV cache usage; 1 means 100 percent.",
           mirrors_stats=True),
    _gauge("cpu_cache_usage", "vllm:cpu_cache_usage_perc",
           "Swap (host) KV block usage; 1 means 100 percent."),
    _counter("prefix_cache_queries", "vllm:prefix_cache_queries",
             "Prompt tokens looked up in the prefix cache.", mirrors_stats=True),
    _counter("prefix_cache_hits", "vllm:prefix_cache_hits",
             "Prompt tokens served from the prefix cache.", mirrors_stats=True),
    _counter("num_preemptions", "vllm:num_preemptions", "Preemptions (swap or recompute).",
             mirrors_stats=True),
    # The disk tier: vLLM names hits from outside the device's prefix cache "external"
    _counter("kv_disk_hits", "vllm:external_prefix_cache_hits",
             "Prompt tokens of prefix-cache hits loaded from the disk tier "
             "(--kv-offloading-backend disk).", mirrors_stats=True),
    _counter("kv_disk_bytes_read", "minivllm:kv_disk_bytes_read",
             "Bytes of KV blocks read from the disk tier.", mirrors_stats=True),
    _counter("kv_disk_bytes_written", "minivllm:kv_disk_bytes_written",
             "Bytes of KV blocks written to the disk tier.", mirrors_stats=True),
    _counter("kv_disk_evictions", "minivllm:kv_disk_evictions",
             "Blocks deleted from the disk tier for room (LRU).", mirrors_stats=True),
    _counter("kv_disk_corrupt", "minivllm:kv_disk_corrupt",
             "Disk tier blocks that failed their check (deleted, recomputed).",
             mirrors_stats=True),
    _gauge("kv_disk_blocks", "minivllm:kv_disk_blocks", "Block files in the disk tier.",
           mirrors_stats=True),
    _gauge("kv_disk_used_bytes", "minivllm:kv_disk_used_bytes",
           "Bytes the disk tier's block files take.", mirrors_stats=True),
    _gauge("kv_disk_capacity_bytes", "minivllm:kv_disk_capacity_bytes",
           "The disk tier's size (--kv-offloading-size).", mirrors_stats=True),
    _counter("num_recomputed_tokens", "minivllm:num_recomputed_tokens",
             "Tokens computed again after recompute preemption (the recompute tax's "
             "numerator).", mirrors_stats=True),
    _counter("num_computed_tokens", "minivllm:num_computed_tokens",
             "Tokens computed by the model, recomputed ones included (prefix-cache hits not).",
             mirrors_stats=True),
    _counter("num_requests_shed", "minivllm:num_requests_shed",
             "Requests finished with an error for missing their deadline while queued (edf).",
             mirrors_stats=True),
    _counter("num_requests_deprioritized", "minivllm:num_requests_deprioritized",
             "Requests ranked last for missing their deadline (edf).", mirrors_stats=True),
    _counter("prompt_tokens", "vllm:prompt_tokens", "Prompt tokens processed."),
    _counter("generation_tokens", "vllm:generation_tokens", "Tokens generated."),
    _counter("request_success", "vllm:request_success", "Finished requests by reason.",
             labels=(*MODEL, "finished_reason"), zeros=FINISH_REASONS),
    _counter("requests_rejected", "vllm:num_requests_rejected",
             "Requests turned away before any output, by reason.", labels=(*MODEL, "reason"),
             zeros=REJECT_REASONS),
    _histogram("ttft", "vllm:time_to_first_token_seconds", "Time to first token.",
               TTFT_BUCKETS),
    _histogram("itl", "vllm:inter_token_latency_seconds", "Time between output tokens.",
               ITL_BUCKETS),
    _histogram("e2e", "vllm:e2e_request_latency_seconds", "Arrival to finish.",
               REQUEST_TIME_BUCKETS),
    _histogram("queue_time", "vllm:request_queue_time_seconds", "Arrival to first scheduled.",
               REQUEST_TIME_BUCKETS),
    _histogram("prefill_time", "vllm:request_prefill_time_seconds",
               "First scheduled to first token.", REQUEST_TIME_BUCKETS),
    _histogram("decode_time", "vllm:request_decode_time_seconds", "First token to finish.",
               REQUEST_TIME_BUCKETS),
    _histogram("request_prompt_tokens", "vllm:request_prompt_tokens",
               "Prompt length of finished requests.", TOKEN_BUCKETS),
    _histogram("request_generation_tokens", "vllm:request_generation_tokens",
               "Tokens generated by finished requests.", TOKEN_BUCKETS),
    _counter("spec_num_drafts", "vllm:spec_decode_num_drafts",
             "Verifications of draft tokens (speculative decoding).", mirrors_stats=True),
    _counter("spec_num_draft_tokens", "vllm:spec_decode_num_draft_tokens",
             "Draft tokens proposed.", mirrors_stats=True),
    _counter("spec_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens",
             "Draft tokens accepted.", mirrors_stats=True),
    _counter("spec_per_pos", "vllm:spec_decode_num_accepted_tokens_per_pos",
             "Draft tokens accepted, by their position in the draft.",
             labels=(*MODEL, "position")),
    # LoRA: vLLM's info gauge (its labels name the adapters, its value is the time), and
    # requests per adapter.
    _gauge("lora_info", "vllm:lora_requests_info", "Running stats on LoRA requests.",
           labels=("max_lora", "waiting_lora_adapters", "running_lora_adapters")),
    _gauge("lora_running", "minivllm:lora_requests_running",
           "Running requests, by LoRA adapter.", labels=(*MODEL, "lora_name")),
    _gauge("lora_waiting", "minivllm:lora_requests_waiting",
           "Waiting requests, by LoRA adapter.", labels=(*MODEL, "lora_name")),
    _counter("lora_received", "minivllm:lora_requests", "Requests received, by LoRA adapter.",
             labels=(*MODEL, "lora_name")),
)


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
