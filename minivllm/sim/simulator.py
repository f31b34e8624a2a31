"""The discrete-event simulator: the engine's own Scheduler (policies, KV-cache manager with
prefix caching, chunked prefill, swap and recompute preemption) driven by a virtual clock,
with a cost model where the model runner would be.

The loop does what EngineCore.step does around the runner, in the same order:
1. requests whose send time has come are added (the engine adds what arrived between steps;
   with max_concurrency, only while fewer are in flight, as the bench client holds them);
2. `schedule()` runs at the current virtual time (the policies' aging reads this clock);
3. the step takes `cost_model.step_time(composition)` seconds; its tokens exist at its end;
4. a request samples a token when the step computes its last known token (as the runner
   does), `update_from_output` advances the scheduler, and a request that reached its
   max_tokens (or the context) finishes with "length" -- every request ignores EOS.
When nothing is in flight the clock jumps to the next arrival. A request the scheduler could
never serve (check_fits) fails with its error, as the server's 400 would.

Output lengths (`request_max_tokens`): "trace" gives each request max_tokens = its trace
output length, so it ends by length -- and a length predictor, clamped to max_tokens, is told
the truth for every request it would overestimate. "context" gives max_tokens = the rest of
the context and stops the request at its trace length as EOS would: the length is unknown
until it ends, as in serving; what length-predictor comparisons need.

Length predictors: `oracle` reads each request's trace output length. `probe` has no model
here: its stand-in feature, handed over when a prefill completes (as the runner hands the
hidden state), is what the trace knows at arrival (`probe_features`): log prompt length and,
for traces with prefix blocks (Mooncake), the first block's id hashed into 32 slots.

Token ids are symbolic (bench/traces.symbolic_prompt) unless prompts are given: the prefix
cache only needs equal blocks to be equal. A request's k-th sampled token is -1-k: like a
greedy model's, its outputs depend only on its prompt.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tqdm import tqdm

from minivllm.bench.client import RequestResult
from minivllm.bench.traces import symbolic_prompt
from minivllm.bench.workload import Trace
from minivllm.core.lifecycle import LifecycleEvent, LifecycleTracer
from minivllm.core.policy import make_policy
from minivllm.core.request import Request, RequestStatus
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.sim.cost_model import CostModel, step_batch


@dataclass
class SimStats:
    """What a real run only shows in the server's metrics."""

    simulated_wall_time_s: float = 0.0
    num_steps: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions_swap: int = 0
    num_preemptions_recompute: int = 0
    peak_kv_usage: float = 0.0
    peak_num_running: int = 0
    peak_num_waiting: int = 0
    num_recomputed_tokens: int = 0  # computed again after recompute preemption
    num_computed_tokens: int = 0
    num_requests_shed: int = 0  # edf: finished for a deadline they could no longer make
    num_requests_deprioritized: int = 0

    @property
    def recompute_tax(self) -> float:
        """Recomputed tokens as a share of all computed tokens."""
        return self.num_recomputed_tokens / self.num_computed_tokens if self.num_computed_tokens else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else None

    def as_dict(self) -> dict:
        return {"simulated_wall_time_s": self.simulated_wall_time_s, "num_steps": self.num_steps,
                "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
                "prefix_cache_queries": self.prefix_cache_queries,
                "prefix_cache_hits": self.prefix_cache_hits,
                "preemptions": {"swap": self.num_preemptions_swap,
                                "recompute": self.num_preemptions_recompute},
                "peak_kv_usage": self.peak_kv_usage, "peak_num_running": self.peak_num_running,
                "peak_num_waiting": self.peak_num_waiting, "recompute_tax": self.recompute_tax,
                "recomputed_tokens": self.num_recomputed_tokens,
                "computed_tokens": self.num_computed_tokens,
                "requests_shed": self.num_requests_shed,
                "requests_deprioritized": self.num_requests_deprioritized}


@dataclass
class SimResult:
    results: list[RequestResult]
    stats: SimStats
    # With record_decisions: per step, ((request id, tokens) in the scheduler's order,
    # preempted ids, swap-out and swap-in block counts).
    decisions: list[tuple] = field(default_factory=list)
    # With record_timeline: every request's lifecycle (core/lifecycle.py), on the virtual clock.
    timeline: list[LifecycleEvent] = field(default_factory=list)


def decision(out) -> tuple:
    """One step's scheduling decisions, comparable between engine and simulator."""
    return (tuple(out.num_scheduled_tokens.items()), tuple(out.preempted_req_ids),
            len(out.swap_out), len(out.swap_in))


class Simulator:
    def __init__(self, config: SchedulerConfig, policy: str, cost_model: CostModel, *,
                 aging_s: float = 10.0, send_priority: bool = False, progress: bool = False,
                 record_decisions: bool = False, max_concurrency: int | None = None,
                 length_predictor: str = "mean", request_max_tokens: str = "trace",
                 record_timeline: bool = False, policy_options: dict | None = None) -> None:
        self.config, self.cost_model = config, cost_model
        self.max_concurrency = max_concurrency
        self.policy_name, self.aging_s = policy, aging_s
        self.send_priority, self.progress = send_priority, progress
        self.record_decisions = record_decisions
        if request_max_tokens not in ("trace", "context"):
            raise ValueError(f"request_max_tokens must be trace or context, got "
                             f"{request_max_tokens!r}")
        self.length_predictor, self.request_max_tokens = length_predictor, request_max_tokens
        self.record_timeline = record_timeline
        self.policy_options = policy_options or {}  # vtc_weights, edf_action, ...
        self.now = 0.0

    def run(self, trace: Trace, prompts: list[list[int]] | None = None) -> SimResult:
        # The scheduler's preemption warnings are for live servers; a simulation counts them.
        log = logging.getLogger("minivllm.core.scheduler")
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            return self._run(trace, prompts)
        finally:
            log.setLevel(level)

    def _run(self, trace: Trace, prompts: list[list[int]] | None) -> SimResult:
        self.now = 0.0
        sched = Scheduler(self.config, make_policy(self.policy_name, self.aging_s,
                                                   length_predictor=self.length_predictor,
                                                   **self.policy_options),
                          clock=lambda: self.now)
        probing = sched.policy.predictor.needs_hidden_state
        entries = trace.entries
        results = [RequestResult(i, e.user, e.priority, e.prompt_tokens, e.output_tokens,
                                 e.send_time, start=e.send_time) for i, e in enumerate(entries)]
        stats, decisions = SimStats(), []
        tracer = None
        if self.record_timeline:  # users as the bench client names them
            tracer = LifecycleTracer(
                sched, self.now, user_of=lambda r: f"user-{entries[int(r.request_id)].user}")
        last_token: dict[str, float] = {}  # request id -> when its latest token came
        bar = tqdm(total=len(entries), disable=not self.progress, desc="simulated requests",
                   mininterval=0.5)
        block_size, max_len = self.config.block_size, self.config.max_model_len
        next_arrival = 0
        limit = self.max_concurrency or len(entries)
        free_since: float | None = 0.0  # since when a client slot has been free
        while next_arrival < len(entries) or sched.has_unfinished_requests():
            # Sent when its time has come and (--max-concurrency) a client slot is free:
            # its latencies count from then, as the bench client's do.
            while (next_arrival < len(entries) and entries[next_arrival].send_time <= self.now
                   and len(last_token) < limit):
                i = next_arrival
                next_arrival += 1
                results[i].start = max(entries[i].send_time, free_since)
                if self._add(sched, entries[i], i, trace, prompts, results[i]):
                    last_token[str(i)] = 0.0
                    free_since = None if len(last_token) >= limit else free_since
                else:
                    bar.update(1)
            if not sched.has_unfinished_requests():
                if next_arrival < len(entries):
                    self.now = max(self.now, entries[next_arrival].send_time)
                continue
            out = sched.schedule()
            for r in sched.take_shed():  # edf: failed, as the server's 503
                results[int(r.request_id)].error = "shed: it could no longer meet its deadline"
                del last_token[r.request_id]
                free_since = self.now if free_since is None else free_since
                bar.update(1)
            if not out.num_scheduled_tokens:
                if not sched.has_unfinished_requests():
                    continue
                if next_arrival >= len(entries):
                    raise RuntimeError(f"simulator stalled at {self.now:.3f} s: nothing "
                                       f"schedulable and no arrival left ({sched.waiting!r})")
                self.now = max(self.now, entries[next_arrival].send_time)
                continue
            if self.record_decisions:
                decisions.append(decision(out))
            if tracer is not None:
                tracer.see_arrivals(self.now)
            prompt_hidden = {}
            for req_id, n in out.num_scheduled_tokens.items():
                r = sched.requests[req_id]
                res = results[int(r.request_id)]
                if res.queue_s is None:
                    res.queue_s = self.now - res.start
                if (probing and r.prompt_hidden is None
                        and r.num_computed_tokens < r.num_prompt_tokens <= r.num_computed_tokens + n):
                    prompt_hidden[req_id] = probe_features(entries[int(req_id)], r, trace)
            for req_id in out.preempted_req_ids:
                swapped = sched.requests[req_id].status is RequestStatus.SWAPPED
                stats.num_preemptions_swap += swapped
                stats.num_preemptions_recompute += not swapped
            requests = sched.requests
            started = self.now
            self.now += self.cost_model.step_time(step_batch(out, requests, block_size))
            stats.num_steps += 1
            stats.peak_kv_usage = max(stats.peak_kv_usage, sched.kv.usage)
            stats.peak_num_running = max(stats.peak_num_running, len(sched.running))
            stats.peak_num_waiting = max(stats.peak_num_waiting, len(sched.waiting))
            sampled = {}
            for req_id, n in out.num_scheduled_tokens.items():
                r = requests[req_id]
                if r.num_computed_tokens + n == r.num_tokens:
                    sampled[req_id] = -1 - r.num_output_tokens  # distinct from prompt ids
            for r in sched.update_from_output(out, sampled, prompt_hidden):
                res = results[int(r.request_id)]
                if res.ttft is None:
                    res.ttft = self.now - res.start
                else:
                    res.itl.append(self.now - last_token[r.request_id])
                last_token[r.request_id] = self.now
                stopped = r.num_output_tokens >= r.oracle_output_len  # EOS, as it were
                if stopped or r.num_output_tokens >= r.max_tokens or r.num_tokens >= max_len:
                    res.predicted_output_tokens = r.predicted_output_len
                    sched.finish_request(r, RequestStatus.FINISHED_STOPPED if stopped
                                         and r.num_output_tokens < r.max_tokens
                                         else RequestStatus.FINISHED_LENGTH)
                    res.output_tokens, res.e2e = r.num_output_tokens, self.now - res.start
                    res.success = True
                    del last_token[r.request_id]
                    free_since = self.now if free_since is None else free_since
                    bar.update(1)
            if tracer is not None:
                tracer.observe(started, self.now, out)
        bar.close()
        stats.simulated_wall_time_s = self.now
        stats.prefix_cache_queries = sched.kv.prefix_cache_queries
        stats.prefix_cache_hits = sched.kv.prefix_cache_hits
        stats.num_recomputed_tokens = sched.recompute_tax.num_recomputed_tokens
        stats.num_computed_tokens = sched.recompute_tax.num_computed_tokens_total
        stats.num_requests_shed = sched.num_requests_shed
        stats.num_requests_deprioritized = sched.num_requests_deprioritized
        timeline = tracer.take(self.now, with_block_map=False).events if tracer else []
        return SimResult(results, stats, decisions, timeline)

    def _add(self, sched: Scheduler, entry, index: int, trace: Trace,
             prompts: list[list[int]] | None, result: RequestResult) -> bool:
        ids = (prompts[index] if prompts is not None
               else symbolic_prompt(entry, index, trace.prefix_block_tokens or 1))
        priority = entry.priority if self.send_priority and entry.priority is not None else 0
        max_tokens = entry.output_tokens
        if self.request_max_tokens == "context":
            max_tokens = max(entry.output_tokens, self.config.max_model_len - len(ids))
        request = Request(str(index), ids, max_tokens, result.start, priority,
                          oracle_output_len=entry.output_tokens, user=str(entry.user))
        try:
            sched.add_request(request)
        except ValueError as e:  # the server's 400
            result.error = f"HTTP 400: {e}"
            return False
        return True


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
