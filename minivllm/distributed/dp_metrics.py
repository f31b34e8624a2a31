"""Statistics of data-parallel replicas: one stats log line per replica plus a total, and one
/metrics page where every replica's series carries an `engine` label (vLLM's convention),
beside the router's own counters."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from minivllm.core.scheduler_stats import SchedulerStats, sum_stats
from minivllm.engine.stat_loggers import LoggingStatLogger, PrometheusStatLogger, StatLoggerBase
from minivllm.engine.stats import IterationStats

# Prefix-hit length at routing, in tokens.
_HIT_BUCKETS = [0, 16, 64, 256, 1024, 4096, 16384, 65536]


class _EngineLabelled:
    """A collector: the replicas' registries as one, each sample labelled with its engine."""

    def __init__(self, registries: list[CollectorRegistry]) -> None:
        self.registries = registries

    def collect(self):
        families = {}
        for engine, registry in enumerate(self.registries):
            for family in registry.collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = type(family)(
                        family.name, family.documentation, family.type, family.unit)
                    merged.samples = []
                merged.samples.extend(s._replace(labels={**s.labels, "engine": str(engine)})
                                      for s in family.samples)
        return list(families.values())


class DataParallelMetrics(StatLoggerBase):
    """The stat logger of data-parallel replicas (DataParallelClient's), each step recorded
    under its replica's `engine_idx`; `registry` is what /metrics serves."""

    def __init__(self, model_name: str, max_model_len: int, num_replicas: int,
                 router_policy: str) -> None:
        self.model_name, self.policy = model_name, router_policy
        self.per_engine = [PrometheusStatLogger(model_name, max_model_len)
                           for _ in range(num_replicas)]
        self.lines = [LoggingStatLogger(prefix=f"Engine {i:03d}: ") for i in range(num_replicas)]
        self.total_line = LoggingStatLogger(prefix=f"Total ({num_replicas} engines): ")
        self.last = [SchedulerStats() for _ in range(num_replicas)]
        self.registry = CollectorRegistry()
        self.registry.register(_EngineLabelled([p.registry for p in self.per_engine]))
        r = self.registry
        self.routed = Counter("minivllm:router_requests", "Requests routed, by policy and replica.",
                              ["model_name", "policy", "replica"], registry=r)
        self.hit_tokens = Histogram("minivllm:router_prefix_hit_tokens",
                                    "Prompt tokens the chosen replica had served before, at "
                                    "routing.", ["model_name", "policy"], buckets=_HIT_BUCKETS,
                                    registry=r)
        self.up = Gauge("minivllm:replica_up", "1 while a replica serves, 0 while it is down.",
                        ["model_name", "engine"], registry=r)
        for i in range(num_replicas):
            self.routed.labels(model_name, router_policy, str(i))
            self.up.labels(model_name, str(i)).set(0)

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats,
               engine_idx: int = 0) -> None:
        self.per_engine[engine_idx].record(scheduler_stats, iteration_stats)
        self.lines[engine_idx].record(scheduler_stats, iteration_stats)
        self.last[engine_idx] = scheduler_stats
        self.total_line.record(sum_stats(self.last), iteration_stats)

    def record_routed(self, replica: int, prefix_hit_tokens: int) -> None:
        self.routed.labels(self.model_name, self.policy, str(replica)).inc()
        self.hit_tokens.labels(self.model_name, self.policy).observe(prefix_hit_tokens)

    def set_up(self, engine: int, up: bool) -> None:
        self.up.labels(self.model_name, str(engine)).set(1 if up else 0)
        if not up:  # a restarted replica starts from zero: its counters must not go back
            self.per_engine[engine]._last = SchedulerStats()
            self.last[engine] = SchedulerStats()

    def record_rejected(self, reason: str, engine_idx: int = 0) -> None:
        self.per_engine[engine_idx].record_rejected(reason)

    def log(self) -> None:
        for line in self.lines:
            line.log()
        self.total_line.log()
