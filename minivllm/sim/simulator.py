"""The discrete-event simulator: N engine replicas (sim/replica.py: each the engine's own
Scheduler and step code, core/step.py, with a cost model where the model runner would be)
behind the router (core/router.py), on one virtual clock. N = 1 is the plain engine
(`minivllm serve`); N > 1 is `minivllm serve --data-parallel-size N`.

Events happen in time order: at each instant, the steps that end now complete first (their
tokens exist, the scheduler's stop rule finishes requests, and each replica's stats report
to the router, as a real replica's step output carries them); then the requests sent by now
are routed and added (the engine adds what arrived between steps; with max_concurrency, only
while fewer are in flight, as the bench client holds them); then every idle replica with
work schedules its next step at the current virtual time (the policies' aging reads this
clock), which takes `cost_model.step_time(composition)` seconds. A request the scheduler
could never serve (check_fits) fails with its error, as the server's 400 would; one the
policy sheds fails as the server's 503.

Output lengths (`request_max_tokens`): "trace" gives each request max_tokens = its trace
output length, so it ends by length -- and a length predictor, clamped to max_tokens, is told
the truth for every request it would overestimate. "context" gives max_tokens = the rest of
the context and the stand-in model samples EOS at the trace length: the length is unknown
until it ends, as in serving; what length-predictor comparisons need.

Length predictors: `oracle` reads each request's trace output length. `probe` has no model
here: its stand-in feature, handed over when a prefill completes (as the runner hands the
hidden state), is what the trace knows at arrival (`probe_features`): log prompt length and,
for traces with prefix blocks (Mooncake), the first block's id hashed into 32 slots.

Token ids are symbolic (bench/traces.symbolic_prompt) unless prompts are given: the prefix
cache only needs equal blocks to be equal.

The prefix cache's disk tier (`disk_tier_bytes`: --kv-offloading-backend disk): each replica
gets one (sim/disk_tier.py, blocks of the cost model's KV bytes). `warm_restart` = F asks
what its persistence is worth: the trace's first F of requests run (F = 1: all of them),
the engine stops (its prefix cache's blocks written to the tier, as EngineCore's shutdown
does) and restarts, its memory empty; the rest of the trace (F = 1: all of it again, its
clock from 0) then runs twice: with the tier as the restart finds it (warm) and with an
empty one (cold: a tier that does not persist). The result is the warm run's, the cold one
beside it. Requests keep their trace index, so their prompts are the same in every run.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace

from tqdm import tqdm

from minivllm.bench.client import RequestResult
from minivllm.bench.traces import symbolic_prompt
from minivllm.bench.workload import Trace
from minivllm.core.lifecycle import LifecycleEvent, LifecycleTracer
from minivllm.core.policy import make_policy
from minivllm.core.request import Request
from minivllm.core.router import DEFAULT_ROUTER_POLICY, make_router
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.scheduler_stats import SchedulerStats, sum_stats
from minivllm.lora.request import LoRARequest
from minivllm.sim.cost_model import CostModel
from minivllm.sim.disk_tier import SimDiskTier
from minivllm.sim.replica import EOS_TOKEN_ID, SimReplica, SyntheticDrafts


@dataclass
class SimStats:
    """What a real run only shows in the server's metrics: the replicas' SchedulerStats at the
    end, added up as data-parallel replicas' are (so every field of it, by construction), and
    what only the simulator sees step by step."""

    simulated_wall_time_s: float = 0.0
    num_steps: int = 0
    peak_kv_usage: float = 0.0
    peak_num_running: int = 0
    peak_num_waiting: int = 0
    scheduler: SchedulerStats = field(default_factory=SchedulerStats)

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        s = self.scheduler
        return s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else None

    def as_dict(self) -> dict:
        s = self.scheduler
        return {"simulated_wall_time_s": self.simulated_wall_time_s, "num_steps": self.num_steps,
                "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
                "prefix_cache_queries": s.prefix_cache_queries,
                "prefix_cache_hits": s.prefix_cache_hits,
                "preemptions": {"swap": s.num_preemptions_swap,
                                "recompute": s.num_preemptions_recompute},
                "peak_kv_usage": self.peak_kv_usage, "peak_num_running": self.peak_num_running,
                "peak_num_waiting": self.peak_num_waiting, "recompute_tax": s.recompute_tax,
                "recomputed_tokens": s.num_recomputed_tokens,
                "computed_tokens": s.num_computed_tokens,
                "requests_shed": s.num_requests_shed,
                "requests_deprioritized": s.num_requests_deprioritized,
                "spec_draft_tokens": s.spec_num_draft_tokens,
                "spec_accepted_tokens": s.spec_num_accepted_tokens,
                "kv_disk_hit_tokens": s.kv_disk_hits,
                "kv_disk_bytes_read": s.kv_disk_bytes_read,
                "kv_disk_bytes_written": s.kv_disk_bytes_written,
                "kv_disk_evictions": s.kv_disk_evictions}


@dataclass
class SimResult:
    results: list[RequestResult]
    stats: SimStats
    # With record_decisions: per step, ((request id, tokens) in the scheduler's order,
    # preempted ids, swap-out and swap-in block counts).
    decisions: list[tuple] = field(default_factory=list)
    # With record_timeline: every request's lifecycle (core/lifecycle.py), on the virtual clock.
    timeline: list[LifecycleEvent] = field(default_factory=list)
    routed: list[int] = field(default_factory=list)  # requests routed to each replica
    prefix_cache_hit_rates: list[float | None] = field(default_factory=list)  # per replica
    router_prefix_hit_tokens: int = 0  # the router's estimate, summed over requests
    cold: SimResult | None = None  # with warm_restart: the run after it with an empty tier
    disaggregated: dict | None = None  # prefill/decode runs (sim/disaggregated.py): the transfers


def decision(out) -> tuple:
    """One step's scheduling decisions, comparable between engine and simulator."""
    return (tuple(out.num_scheduled_tokens.items()), tuple(out.preempted_req_ids),
            len(out.swap_out), len(out.swap_in))


class Simulator:
    def __init__(self, config: SchedulerConfig, policy: str, cost_model: CostModel, *,
                 data_parallel_size: int = 1, router_policy: str = DEFAULT_ROUTER_POLICY,
                 sticky_sessions: bool = False, aging_s: float = 10.0,
                 send_priority: bool = False, progress: bool = False,
                 record_decisions: bool = False, max_concurrency: int | None = None,
                 length_predictor: str = "mean", request_max_tokens: str = "trace",
                 record_timeline: bool = False, policy_options: dict | None = None,
                 spec_acceptance_rate: float | None = None, num_loras: int = 0,
                 disk_tier_bytes: int | None = None, warm_restart: float | None = None
                 ) -> None:
        """`spec_acceptance_rate`: with config.speculative_config, each draft token is right
        with this probability (SyntheticDrafts); None: the method's own proposer (ngram,
        suffix), which finds nothing in the stand-in's never-repeating tokens.
        `num_loras`: request i runs LoRA adapter i mod num_loras (0: the base model).
        `disk_tier_bytes`: each replica's disk tier holds this many bytes (None: no tier)."""
        if warm_restart is not None and disk_tier_bytes is None:
            raise ValueError("warm_restart (--kv-offloading-warm-restart) needs a disk tier "
                             "(--kv-offloading-backend disk)")
        if warm_restart is not None and not 0 < warm_restart <= 1:
            raise ValueError(f"warm_restart (--kv-offloading-warm-restart) is the fraction of "
                             f"the trace run before the restart: in (0, 1], got {warm_restart}")
        if disk_tier_bytes is not None and cost_model.kv_bytes_per_token is None:
            raise ValueError(f"{cost_model.name} knows no KV bytes per token: it cannot size "
                             "the disk tier's blocks")
        self.disk_tier_bytes, self.warm_restart = disk_tier_bytes, warm_restart
        if num_loras < 0:
            raise ValueError(f"num_loras must be >= 0, got {num_loras}")
        self.num_loras = num_loras
        if request_max_tokens not in ("trace", "context"):
            raise ValueError(f"request_max_tokens must be trace or context, got "
                             f"{request_max_tokens!r}")
        if data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be >= 1, got {data_parallel_size}")
        if record_timeline and data_parallel_size > 1:
            raise ValueError("the timeline is recorded with one replica only")
        self.config, self.cost_model = config, cost_model
        # a served profile's request terms (sim/served_overhead.py): the way in and the
        # first token's way out, added to each request's latencies (the spacing of its
        # tokens unchanged; the milliseconds in move no scheduling decision that matters)
        served = getattr(cost_model, "served", None)
        self.request_latency_s = served.request_in_s + served.first_token_out_s if served else 0.0
        self.size, self.router_policy = data_parallel_size, router_policy
        self.sticky_sessions = sticky_sessions
        self.max_concurrency = max_concurrency
        self.policy_name, self.aging_s = policy, aging_s
        self.send_priority, self.progress = send_priority, progress
        self.record_decisions = record_decisions
        self.length_predictor, self.request_max_tokens = length_predictor, request_max_tokens
        self.record_timeline = record_timeline
        self.policy_options = policy_options or {}  # vtc_weights, edf_action, ...
        spec = config.speculative_config
        if spec_acceptance_rate is not None and spec is None:
            raise ValueError("spec_acceptance_rate needs a speculative_config")
        if spec and spec["method"] == "draft_model" and spec_acceptance_rate is None:
            raise ValueError("the simulator runs no draft model: give draft_model's acceptance "
                             "rate (spec_acceptance_rate, --spec-acceptance-rate)")
        self.spec_acceptance_rate = spec_acceptance_rate
        self.now = 0.0

    def run(self, trace: Trace, prompts: list[list[int]] | None = None) -> SimResult:
        # The scheduler's preemption warnings are for live servers; a simulation counts them.
        log = logging.getLogger("minivllm.core.scheduler")
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            if self.warm_restart is None:
                return self._run(trace, prompts, self._disk_tiers())
            return self._run_warm_restart(trace, prompts)
        finally:
            log.setLevel(level)

    def _run_warm_restart(self, trace: Trace, prompts: list[list[int]] | None) -> SimResult:
        entries = trace.entries
        num_before = math.ceil(self.warm_restart * len(entries))
        first = 0 if num_before == len(entries) else num_before  # the first one after it
        t0 = entries[first].send_time
        after = replace(trace, entries=[replace(e, send_time=e.send_time - t0)
                                        for e in entries[first:]])
        before_prompts, after_prompts = (None, None) if prompts is None else (
            prompts[:num_before], prompts[first:])
        tiers = self._disk_tiers()
        self._run(replace(trace, entries=entries[:num_before]), before_prompts, tiers)
        for replica, tier in zip(self.replicas, tiers, strict=True):
            tier.write(replica.scheduler.kv.cached_for_disk())  # the engine stops
        warm = self._run(after, after_prompts, [t.reopened() for t in tiers], first)
        warm.cold = self._run(after, after_prompts, self._disk_tiers(), first)
        return warm

    def _disk_tiers(self) -> list[SimDiskTier | None]:
        """Each replica's, empty."""
        if self.disk_tier_bytes is None:
            return [None] * self.size
        block_bytes = self.cost_model.kv_bytes_per_token * self.config.block_size
        return [SimDiskTier(self.disk_tier_bytes, block_bytes) for _ in range(self.size)]

    def _replica(self, trace: Trace, disk: SimDiskTier | None) -> SimReplica:
        policy = make_policy(self.policy_name, self.aging_s,
                             length_predictor=self.length_predictor, **self.policy_options)
        drafts = (None if self.spec_acceptance_rate is None
                  else SyntheticDrafts(self.spec_acceptance_rate))
        scheduler = Scheduler(self.config, policy, clock=lambda: self.now,
                              eos_token_ids=(EOS_TOKEN_ID,), proposer=drafts)
        scheduler.kv.disk = disk
        entries = trace.entries
        return SimReplica(scheduler, self.cost_model, lambda request: probe_features(
            entries[int(request.request_id)], request, trace))

    def _run(self, trace: Trace, prompts: list[list[int]] | None,
             disk_tiers: list[SimDiskTier | None], first_index: int = 0) -> SimResult:
        """`first_index`: the trace index of the first entry (its symbolic prompt's)."""
        self.now = 0.0
        config, entries = self.config, trace.entries
        self.replicas = replicas = [self._replica(trace, disk) for disk in disk_tiers]
        router = make_router(self.router_policy, self.size, config.block_size,
                             sticky_sessions=self.sticky_sessions,
                             cache_capacity_blocks=config.num_blocks)
        self.results = [RequestResult(i, e.user, e.priority, e.prompt_tokens, e.output_tokens,
                                      e.send_time, start=e.send_time)
                        for i, e in enumerate(entries)]
        self.stats, self.decisions = SimStats(), []
        self.tracer = None
        if self.record_timeline:  # users as the bench client names them
            self.tracer = LifecycleTracer(
                replicas[0].scheduler, self.now,
                user_of=lambda r: f"user-{entries[int(r.request_id)].user}")
        self.last_token: dict[str, float] = {}  # request id -> when its latest token came
        self.bar = tqdm(total=len(entries), disable=not self.progress,
                        desc="simulated requests", mininterval=0.5)
        self.free_since: float | None = 0.0  # since when a client slot has been free
        limit = self.max_concurrency or len(entries)
        next_arrival, hit_tokens = 0, 0
        while True:
            arrival = (entries[next_arrival].send_time
                       if next_arrival < len(entries) and len(self.last_token) < limit
                       else math.inf)
            step_end = min(r.busy_until for r in replicas)
            if arrival == step_end == math.inf:
                waiting = [r for replica in replicas for r in replica.scheduler.waiting]
                if any(r.scheduler.has_unfinished_requests() for r in replicas):
                    raise RuntimeError(f"simulator stalled at {self.now:.3f} s: nothing "
                                       f"schedulable and no arrival left ({waiting!r})")
                break
            self.now = max(self.now, min(arrival, step_end))
            for index, replica in enumerate(replicas):
                if replica.busy_until <= self.now:
                    self._complete(replica)
                    s = replica.scheduler  # the requests held for its next step wait too
                    router.update_stats(index, len(s.running),
                                        len(s.waiting) + len(replica.pending), s.kv.usage)
            # Sent when its time has come and (--max-concurrency) a client slot is free:
            # its latencies count from then, as the bench client's do.
            while (next_arrival < len(entries) and entries[next_arrival].send_time <= self.now
                   and len(self.last_token) < limit):
                i = next_arrival
                next_arrival += 1
                self.results[i].start = max(entries[i].send_time, self.free_since)
                ids = (prompts[i] if prompts is not None
                       else symbolic_prompt(entries[i], first_index + i,
                                            trace.prefix_block_tokens or 1))
                decision = router.route(ids, user=str(entries[i].user))
                replica = replicas[decision.replica]
                request = self._request(replica.scheduler, entries[i], i, ids)
                if request is not None:
                    replica.pending.append(request)
                    hit_tokens += decision.prefix_hit_tokens
                    self.last_token[str(i)] = 0.0
                    if len(self.last_token) >= limit:
                        self.free_since = None
                else:
                    self.bar.update(1)
            for replica in replicas:
                if replica.busy_until == math.inf:
                    replica.add_pending()
                    if replica.scheduler.has_unfinished_requests():
                        self._start(replica)
        self.bar.close()
        final = [r.scheduler.stats() for r in replicas]
        self.stats.simulated_wall_time_s = self.now
        self.stats.scheduler = sum_stats(final)
        timeline = self.tracer.take(self.now, with_block_map=False).events if self.tracer else []
        return SimResult(self.results, self.stats, self.decisions, timeline,
                         routed=list(router.num_routed),
                         prefix_cache_hit_rates=[
                             s.prefix_cache_hits / s.prefix_cache_queries
                             if s.prefix_cache_queries else None for s in final],
                         router_prefix_hit_tokens=hit_tokens)

    def _request(self, sched: Scheduler, entry, index: int, ids: list[int]) -> Request | None:
        """The request the bench client would send, or None if the server would answer 400
        (the scheduler could never serve it)."""
        result = self.results[index]
        priority = entry.priority if self.send_priority and entry.priority is not None else 0
        max_tokens = entry.output_tokens
        if self.request_max_tokens == "context":
            max_tokens = max(entry.output_tokens, self.config.max_model_len - len(ids))
        try:
            sched.check_fits(len(ids), max_tokens)
        except ValueError as e:
            result.error = f"HTTP 400: {e}"
            return None
        lora = (LoRARequest(f"lora-{index % self.num_loras}", index % self.num_loras + 1,
                            "simulated") if self.num_loras else None)
        return Request.make(str(index), ids, max_tokens, result.start, priority=priority,
                            oracle_output_len=entry.output_tokens, user=str(entry.user),
                            lora_request=lora)

    def _start(self, replica: SimReplica) -> None:
        """The replica schedules its next step now; it stays idle if nothing can run."""
        scheduled = replica.start(self.now)
        for r in scheduled.shed:  # edf: failed, as the server's 503
            self.results[int(r.request_id)].error = "shed: it could no longer meet its deadline"
            self._done(r)
        if replica.step is None:
            return  # it waits for an arrival (the simulator stalls if none is left)
        out, sched, stats = scheduled.scheduler_output, replica.scheduler, self.stats
        if self.record_decisions:
            self.decisions.append(decision(out))
        if self.tracer is not None:
            self.tracer.see_arrivals(self.now)
        for req_id in out.num_scheduled_tokens:
            result = self.results[int(req_id)]
            if result.queue_s is None:
                result.queue_s = self.now - result.start
        stats.num_steps += 1
        stats.peak_kv_usage = max(stats.peak_kv_usage, sched.kv.usage)
        stats.peak_num_running = max(stats.peak_num_running, len(sched.running))
        stats.peak_num_waiting = max(stats.peak_num_waiting, len(sched.waiting))

    def _complete(self, replica: SimReplica) -> None:
        """The replica's step ends now: its tokens exist, the requests they end finish."""
        out, started = replica.step.scheduler_output, replica.started
        for r in replica.complete().sampled:
            res = self.results[int(r.request_id)]
            if res.ttft is None:
                res.ttft = self.now - res.start + self.request_latency_s
            else:
                res.itl.append(self.now - self.last_token[r.request_id])
            self.last_token[r.request_id] = self.now
            if r.is_finished:
                res.predicted_output_tokens = r.predicted_output_len
                res.output_tokens = r.num_output_tokens
                res.e2e = self.now - res.start + self.request_latency_s
                res.success = True
                self._done(r)
        if self.tracer is not None:
            self.tracer.observe(started, self.now, out)

    def _done(self, request: Request) -> None:
        """A request left the simulation: its client slot is free."""
        del self.last_token[request.request_id]
        if self.free_since is None:
            self.free_since = self.now
        self.bar.update(1)


def probe_features(entry, request: Request, trace: Trace) -> list[float]:
    """`probe`'s stand-in for a hidden state in the simulator: what the trace says about a
    request at arrival, never its output length. Log prompt length (and its square); with
    prefix blocks (Mooncake's hash_ids), the first block's token id hashed into 32 one-hot
    slots -- requests sharing a system prompt share it. Symbolic prompts carry nothing else."""
    import math

    x = math.log1p(request.num_prompt_tokens)
    slots = [0.0] * 32
    if trace.prefix_block_tokens and entry.hash_ids:
        slots[entry.hash_ids[0] % 32] = 1.0
    return [x, x * x, *slots]
