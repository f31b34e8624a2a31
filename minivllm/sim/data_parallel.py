"""Data-parallel serving, simulated: N engine replicas (each the engine's own Scheduler and
KV manager on the shared virtual clock, each with its own cost model) behind the router
(core/router.py), as `minivllm serve --data-parallel-size N` runs them.

Events happen in time order: at each instant, steps that end now are applied first (tokens,
finishes, and the replica's stats report to the router, as a real replica's step output
carries them), then the requests sent by now are routed and added, then every idle replica
with work starts its next step. With one replica this is Simulator's loop exactly (the tests
check that it gives the same latencies).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from tqdm import tqdm

from minivllm.bench.client import RequestResult
from minivllm.bench.traces import symbolic_prompt
from minivllm.bench.workload import Trace
from minivllm.core.policy import make_policy
from minivllm.core.request import Request, RequestStatus
from minivllm.core.router import make_router
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.sim.cost_model import CostModel, step_batch
from minivllm.sim.simulator import SimResult, SimStats


@dataclass
class DataParallelResult(SimResult):
    routed: list[int] = field(default_factory=list)  # requests routed to each replica
    prefix_cache_hit_rates: list[float | None] = field(default_factory=list)  # per replica
    router_prefix_hit_tokens: int = 0  # the router's estimate, summed over requests


class _Replica:
    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.busy_until = math.inf  # when the step it runs ends; inf: idle
        self.out = None  # that step's SchedulerOutput


class DataParallelSimulator:
    def __init__(self, config: SchedulerConfig, policy: str, cost_model: CostModel, *,
                 data_parallel_size: int, router_policy: str, aging_s: float = 10.0,
                 send_priority: bool = False, progress: bool = False,
                 max_concurrency: int | None = None, sticky_sessions: bool = False,
                 length_predictor: str = "mean", request_max_tokens: str = "trace",
                 policy_options: dict | None = None) -> None:
        if request_max_tokens not in ("trace", "context"):
            raise ValueError(f"request_max_tokens must be trace or context, got "
                             f"{request_max_tokens!r}")
        self.config, self.cost_model = config, cost_model
        # As Simulator's: "context" stops a request at its trace length as EOS would.
        self.length_predictor, self.request_max_tokens = length_predictor, request_max_tokens
        self.policy_options = policy_options or {}  # vtc_weights, edf_action, ...
        self.policy_name, self.aging_s = policy, aging_s
        self.size, self.router_policy = data_parallel_size, router_policy
        self.send_priority, self.progress = send_priority, progress
        self.max_concurrency, self.sticky_sessions = max_concurrency, sticky_sessions
        self.now = 0.0

    def run(self, trace: Trace, prompts: list[list[int]] | None = None) -> DataParallelResult:
        log = logging.getLogger("minivllm.core.scheduler")  # preemption warnings: counted
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            return self._run(trace, prompts)
        finally:
            log.setLevel(level)

    def _run(self, trace: Trace, prompts: list[list[int]] | None) -> DataParallelResult:
        self.now = 0.0
        config = self.config
        replicas = [_Replica(Scheduler(config, make_policy(self.policy_name, self.aging_s,
                                                           length_predictor=self.length_predictor,
                                                           **self.policy_options),
                                       clock=lambda: self.now)) for _ in range(self.size)]
        if replicas[0].sched.policy.predictor.needs_hidden_state:
            raise ValueError(f"the {self.length_predictor} length predictor is not simulated "
                             "with data parallelism (it needs prompt hidden states)")
        router = make_router(self.router_policy, self.size, config.block_size,
                             sticky_sessions=self.sticky_sessions,
                             cache_capacity_blocks=config.num_blocks)
        entries = trace.entries
        results = [RequestResult(i, e.user, e.priority, e.prompt_tokens, e.output_tokens,
                                 e.send_time, start=e.send_time) for i, e in enumerate(entries)]
        self.stats, self.results = SimStats(), results
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
                if any(r.sched.has_unfinished_requests() for r in replicas):
                    raise RuntimeError(f"simulator stalled at {self.now:.3f} s: nothing "
                                       "schedulable and no arrival left")
                break
            self.now = max(self.now, min(arrival, step_end))
            for index, replica in enumerate(replicas):
                if replica.busy_until <= self.now:
                    self._complete(replica)
                    s = replica.sched
                    router.update_stats(index, len(s.running), len(s.waiting), s.kv.usage)
            while (next_arrival < len(entries) and entries[next_arrival].send_time <= self.now
                   and len(self.last_token) < limit):
                i = next_arrival
                next_arrival += 1
                results[i].start = max(entries[i].send_time, self.free_since)
                ids = (prompts[i] if prompts is not None
                       else symbolic_prompt(entries[i], i, trace.prefix_block_tokens or 1))
                decision = router.route(ids, user=str(entries[i].user))
                if self._add(replicas[decision.replica].sched, entries[i], i, ids):
                    hit_tokens += decision.prefix_hit_tokens
                    self.last_token[str(i)] = 0.0
                    if len(self.last_token) >= limit:
                        self.free_since = None
                else:
                    self.bar.update(1)
            for replica in replicas:
                if replica.busy_until == math.inf and replica.sched.has_unfinished_requests():
                    self._start(replica)
        self.bar.close()
        stats = self.stats
        stats.simulated_wall_time_s = self.now
        scheds = [r.sched for r in replicas]
        stats.num_recomputed_tokens = sum(s.recompute_tax.num_recomputed_tokens for s in scheds)
        stats.num_computed_tokens = sum(s.recompute_tax.num_computed_tokens_total for s in scheds)
        stats.num_requests_shed = sum(s.num_requests_shed for s in scheds)
        stats.num_requests_deprioritized = sum(s.num_requests_deprioritized for s in scheds)
        kvs = [s.kv for s in scheds]
        stats.prefix_cache_queries = sum(kv.prefix_cache_queries for kv in kvs)
        stats.prefix_cache_hits = sum(kv.prefix_cache_hits for kv in kvs)
        rates = [kv.prefix_cache_hits / kv.prefix_cache_queries if kv.prefix_cache_queries
                 else None for kv in kvs]
        return DataParallelResult(results, stats, routed=list(router.num_routed),
                                  prefix_cache_hit_rates=rates,
                                  router_prefix_hit_tokens=hit_tokens)

    def _add(self, sched: Scheduler, entry, index: int, ids: list[int]) -> bool:
        result = self.results[index]
        priority = entry.priority if self.send_priority and entry.priority is not None else 0
        max_tokens = entry.output_tokens
        if self.request_max_tokens == "context":
            max_tokens = max(entry.output_tokens, self.config.max_model_len - len(ids))
        try:
            sched.add_request(Request(str(index), ids, max_tokens, result.start, priority,
                                      oracle_output_len=entry.output_tokens,
                                      user=str(entry.user)))
        except ValueError as e:  # the server's 400
            result.error = f"HTTP 400: {e}"
            return False
        return True

    def _start(self, replica: _Replica) -> None:
        """Schedule the replica's next step now; it stays idle if nothing can run."""
        sched, stats = replica.sched, self.stats
        out = sched.schedule()
        for r in sched.take_shed():  # edf: failed, as the server's 503
            self.results[int(r.request_id)].error = "shed: it could no longer meet its deadline"
            del self.last_token[r.request_id]
            if self.free_since is None:
                self.free_since = self.now
            self.bar.update(1)
        if not out.num_scheduled_tokens:
            return  # it waits for an arrival (the simulator stalls if none is left)
        for req_id in out.preempted_req_ids:
            swapped = sched.requests[req_id].status is RequestStatus.SWAPPED
            stats.num_preemptions_swap += swapped
            stats.num_preemptions_recompute += not swapped
        replica.out = out
        replica.busy_until = self.now + self.cost_model.step_time(
            step_batch(out, sched.requests, self.config.block_size))
        stats.num_steps += 1
        stats.peak_kv_usage = max(stats.peak_kv_usage, sched.kv.usage)
        stats.peak_num_running = max(stats.peak_num_running, len(sched.running))
        stats.peak_num_waiting = max(stats.peak_num_waiting, len(sched.waiting))

    def _complete(self, replica: _Replica) -> None:
        """The step that ends now: its tokens exist, requests at their length finish."""
        sched, out = replica.sched, replica.out
        replica.busy_until, replica.out = math.inf, None
        requests, sampled = sched.requests, {}
        for req_id, n in out.num_scheduled_tokens.items():
            r = requests[req_id]
            if r.num_computed_tokens + n == r.num_tokens:
                sampled[req_id] = -1 - r.num_output_tokens  # distinct from prompt ids
        for r in sched.update_from_output(out, sampled):
            res = self.results[int(r.request_id)]
            if res.ttft is None:
                res.ttft = self.now - res.start
            else:
                res.itl.append(self.now - self.last_token[r.request_id])
            self.last_token[r.request_id] = self.now
            stopped = r.num_output_tokens >= r.oracle_output_len  # EOS, as it were
            if (stopped or r.num_output_tokens >= r.max_tokens
                    or r.num_tokens >= self.config.max_model_len):
                sched.finish_request(r, RequestStatus.FINISHED_STOPPED if stopped
                                     and r.num_output_tokens < r.max_tokens
                                     else RequestStatus.FINISHED_LENGTH)
                res.output_tokens, res.e2e = r.num_output_tokens, self.now - res.start
                res.success = True
                del self.last_token[r.request_id]
                if self.free_since is None:
                    self.free_since = self.now
                self.bar.update(1)
