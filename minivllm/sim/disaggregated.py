"""Prefill/decode disaggregation, simulated (`minivllm sim serve --prefill-instances P
--decode-instances D`, `sim plan --disaggregated`): P prefill replicas and D decode
replicas, each the engine's own scheduler and step code with the cost model (sim/replica.py),
on one virtual clock, as DistServe, Splitwise and vLLM's disaggregated prefill split them.

A request goes to a prefill replica (the router over the P), which runs its prompt and
samples its first token (max_tokens 1, as vLLM's prefill instance runs it): that token is
the client's first (TTFT). The prompt's full KV blocks then cross a link to a decode replica
(the router over the D): one link per decode replica, one transfer at a time on it
(sim/kv_link.py), B bytes taking B / bandwidth + latency. There the request continues: its
prompt and first token are the decode request's prompt, whose transferred blocks the decode
replica's KV manager finds in its receive buffer and loads (a prefix hit, priced at the
link's rate), computing only the tail past the last full block and the first token, then
the rest of the output. A request whose prompt and output fit nowhere fails as the
server's 400; one with a single output token ends on the prefill side.

Both sides run the same policy; a decode replica out of free blocks holds the transferred
request in its waiting queue (back-pressure: nothing is dropped). The served profile's
request latencies (sim/served_overhead.py) are added as in sim/simulator.py.
"""

from __future__ import annotations

import copy
import heapq
import logging
import math

from minivllm.bench.client import RequestResult
from minivllm.bench.traces import symbolic_prompt
from minivllm.bench.workload import Trace
from minivllm.core.policy import make_policy
from minivllm.core.request import Request
from minivllm.core.router import DEFAULT_ROUTER_POLICY, make_router
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.scheduler_stats import sum_stats
from minivllm.sim.cost_model import CostModel
from minivllm.sim.kv_link import KVLink, ReceiveBuffer
from minivllm.sim.replica import EOS_TOKEN_ID, SimReplica
from minivllm.sim.simulator import SimResult, SimStats


class DisaggregatedSimulator:
    def __init__(self, config: SchedulerConfig, policy: str, cost_model: CostModel, *,
                 prefill_instances: int, decode_instances: int, transfer_bandwidth: float,
                 transfer_latency_s: float = 0.0,
                 router_policy: str = DEFAULT_ROUTER_POLICY, aging_s: float = 10.0,
                 send_priority: bool = False, length_predictor: str = "mean",
                 request_max_tokens: str = "trace", policy_options: dict | None = None
                 ) -> None:
        """`transfer_bandwidth`: bytes/s of each link (and of the decode side's copy of the
        received blocks into its cache)."""
        if prefill_instances < 1 or decode_instances < 1:
            raise ValueError(f"disaggregated serving needs >= 1 prefill and >= 1 decode "
                             f"instance, got {prefill_instances} and {decode_instances}")
        if cost_model.kv_bytes_per_token is None:
            raise ValueError(f"{cost_model.name} knows no KV bytes per token: it cannot price "
                             "the KV transfer")
        if not config.enable_prefix_caching:
            raise ValueError("the decode instances receive the KV through their prefix "
                             "cache: drop --no-enable-prefix-caching")
        if request_max_tokens not in ("trace", "context"):
            raise ValueError(f"request_max_tokens must be trace or context, got "
                             f"{request_max_tokens!r}")
        KVLink(transfer_bandwidth, transfer_latency_s)  # checks them
        self.config, self.policy_name, self.cost_model = config, policy, cost_model
        self.num_prefill, self.num_decode = prefill_instances, decode_instances
        self.bandwidth, self.latency_s = transfer_bandwidth, transfer_latency_s
        self.router_policy, self.aging_s = router_policy, aging_s
        self.send_priority, self.length_predictor = send_priority, length_predictor
        self.request_max_tokens = request_max_tokens
        self.policy_options = policy_options or {}
        served = getattr(cost_model, "served", None)
        self.request_latency_s = served.request_in_s + served.first_token_out_s if served else 0.0
        self.block_bytes = cost_model.kv_bytes_per_token * config.block_size
        # the decode side copies what it received into its cache at the link's rate
        self.decode_cost = copy.copy(cost_model)
        self.decode_cost.disk_read_bandwidth = transfer_bandwidth
        self.now = 0.0

    def _scheduler(self) -> Scheduler:
        policy = make_policy(self.policy_name, self.aging_s,
                             length_predictor=self.length_predictor, **self.policy_options)
        return Scheduler(self.config, policy, clock=lambda: self.now,
                         eos_token_ids=(EOS_TOKEN_ID,))

    def _decode_replica(self) -> SimReplica:
        scheduler = self._scheduler()
        # room for as many blocks as its cache holds, waiting to be admitted
        scheduler.kv.disk = ReceiveBuffer(self.config.num_blocks * self.block_bytes,
                                          self.block_bytes)
        return SimReplica(scheduler, self.decode_cost)

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
        self.now, entries, config = 0.0, trace.entries, self.config
        self.prefill = [SimReplica(self._scheduler(), self.cost_model)
                        for _ in range(self.num_prefill)]
        self.decode = [self._decode_replica() for _ in range(self.num_decode)]
        self.links = [KVLink(self.bandwidth, self.latency_s) for _ in self.decode]
        routers = [make_router(self.router_policy, len(side), config.block_size,
                               cache_capacity_blocks=config.num_blocks)
                   for side in (self.prefill, self.decode)]
        self.prefill_router, self.decode_router = routers
        self.results = [RequestResult(i, e.user, e.priority, e.prompt_tokens, e.output_tokens,
                                      e.send_time, start=e.send_time)
                        for i, e in enumerate(entries)]
        self.stats = SimStats()
        self.last_token: dict[int, float] = {}  # request index -> when its latest token came
        # transfers on their links: (arrives, order sent, decode replica, block keys, the
        # decode side's request)
        self.in_flight: list[tuple[float, int, int, list[bytes], Request]] = []
        self._decode_fields: dict[int, tuple[int, int, dict]] = {}  # index -> its decode part
        self.transfer_s: list[float] = []  # per transfer: first token -> on the decode side
        next_arrival = 0
        replicas = self.prefill + self.decode
        while True:
            arrival = entries[next_arrival].send_time if next_arrival < len(entries) else math.inf
            landing = self.in_flight[0][0] if self.in_flight else math.inf
            step_end = min(r.busy_until for r in replicas)
            if arrival == landing == step_end == math.inf:
                if any(r.scheduler.has_unfinished_requests() for r in replicas):
                    raise RuntimeError(f"simulator stalled at {self.now:.3f} s: nothing "
                                       "schedulable and no arrival left")
                break
            self.now = max(self.now, min(arrival, landing, step_end))
            for side, router in ((self.prefill, self.prefill_router),
                                 (self.decode, self.decode_router)):
                for index, replica in enumerate(side):
                    if replica.busy_until <= self.now:
                        self._complete(replica, side is self.prefill)
                        s = replica.scheduler
                        router.update_stats(index, len(s.running),
                                            len(s.waiting) + len(replica.pending), s.kv.usage)
            while self.in_flight and self.in_flight[0][0] <= self.now:
                _, _, index, keys, request = heapq.heappop(self.in_flight)
                self.decode[index].scheduler.kv.disk.receive(keys)
                self.decode[index].pending.append(request)
            while next_arrival < len(entries) and entries[next_arrival].send_time <= self.now:
                i, next_arrival = next_arrival, next_arrival + 1
                ids = (prompts[i] if prompts is not None
                       else symbolic_prompt(entries[i], i, trace.prefix_block_tokens or 1))
                self._arrive(i, entries[i], ids)
            for replica in replicas:
                if replica.busy_until == math.inf:
                    replica.add_pending()
                    if replica.scheduler.has_unfinished_requests():
                        self._start(replica)
        return self._result()

    def _arrive(self, index: int, entry, ids: list[int]) -> None:
        """Sent now: to a prefill replica, for its prompt and first token, unless the
        request could never be served (the server's 400)."""
        result = self.results[index]
        max_tokens = entry.output_tokens
        if self.request_max_tokens == "context":
            max_tokens = max(entry.output_tokens, self.config.max_model_len - len(ids))
        try:
            self.prefill[0].scheduler.check_fits(len(ids), max_tokens)
        except ValueError as e:
            result.error = f"HTTP 400: {e}"
            return
        priority = entry.priority if self.send_priority and entry.priority is not None else 0
        fields = {"priority": priority, "user": str(entry.user)}
        self._decode_fields[index] = (max_tokens - 1, entry.output_tokens - 1, fields)
        replica = self.prefill_router.route(ids, user=str(entry.user)).replica
        self.prefill[replica].pending.append(Request.make(
            str(index), ids, 1, result.start, oracle_output_len=1, **fields))
        self.last_token[index] = 0.0

    def _start(self, replica: SimReplica) -> None:
        scheduled = replica.start(self.now)
        if replica.step is None:
            return
        out, sched, stats = scheduled.scheduler_output, replica.scheduler, self.stats
        for req_id in out.num_scheduled_tokens:
            result = self.results[int(req_id)]
            if result.queue_s is None:
                result.queue_s = self.now - result.start
        stats.num_steps += 1
        stats.peak_num_running = max(stats.peak_num_running, len(sched.running))
        stats.peak_num_waiting = max(stats.peak_num_waiting, len(sched.waiting))
        stats.peak_kv_usage = max(stats.peak_kv_usage, sched.kv.usage)

    def _complete(self, replica: SimReplica, prefill: bool) -> None:
        """A step ends now: its tokens exist. A prefill replica's request with more to
        generate leaves for a decode replica, its KV blocks on the link."""
        for r in replica.complete().sampled:
            index = int(r.request_id)
            res = self.results[index]
            if prefill:
                res.ttft = self.now - res.start + self.request_latency_s
            else:
                res.itl.append(self.now - self.last_token[index])
            self.last_token[index] = self.now
            if not r.is_finished:
                continue
            max_tokens, oracle, fields = self._decode_fields[index]
            if prefill and max_tokens > 0:
                self._transfer(replica, r, max_tokens, oracle, fields)
                continue
            res.output_tokens = len(res.itl) + 1
            res.e2e = self.now - res.start + self.request_latency_s
            res.success = True
            del self.last_token[index]

    def _transfer(self, replica: SimReplica, r: Request, max_tokens: int, oracle: int,
                  fields: dict) -> None:
        """The prompt's full blocks to a decode replica's receive buffer, over its link; the
        request (prompt + first token) joins that replica when they have arrived."""
        ids = [*r.prompt_token_ids, *r.output_token_ids]
        index = self.decode_router.route(ids, user=fields["user"]).replica
        keys = replica.scheduler.kv.disk_keys(r)[:r.num_prompt_tokens // self.config.block_size]
        arrives = self.links[index].send(self.now, len(keys) * self.block_bytes)
        self.transfer_s.append(arrives - self.now)
        request = Request.make(r.request_id, ids, max_tokens, self.results[int(
            r.request_id)].start, oracle_output_len=oracle, **fields)
        heapq.heappush(self.in_flight, (arrives, len(self.transfer_s), index, keys, request))

    def _result(self) -> SimResult:
        prefill = [r.scheduler.stats() for r in self.prefill]
        decode = [r.scheduler.stats() for r in self.decode]
        self.stats.simulated_wall_time_s = self.now
        self.stats.scheduler = sum_stats(prefill + decode)
        waits = sorted(self.transfer_s)
        links = self.links
        transfer = {
            "prefill_instances": self.num_prefill, "decode_instances": self.num_decode,
            "bandwidth_gbps": self.bandwidth / 1e9, "latency_ms": self.latency_s * 1e3,
            "transfers": sum(link.transfers for link in links),
            "bytes": sum(link.bytes_sent for link in links),
            # first token -> blocks on the decode side (queueing for the link included)
            "transfer_ms": {"mean": 1e3 * sum(waits) / len(waits),
                            "p50": 1e3 * waits[len(waits) // 2],
                            "p99": 1e3 * waits[min(len(waits) - 1, int(0.99 * len(waits)))]}
            if waits else None,
            "link_busy": [link.busy_s / self.now if self.now else 0.0 for link in links],
            # prompt tokens the decode side loaded, not recomputed
            "received_tokens": sum(s.kv_disk_hits for s in decode),
            "routed_prefill": list(self.prefill_router.num_routed),
            "routed_decode": list(self.decode_router.num_routed)}
        return SimResult(self.results, self.stats,
                         routed=list(self.prefill_router.num_routed)
                         + list(self.decode_router.num_routed),
                         prefix_cache_hit_rates=[
                             s.prefix_cache_hits / s.prefix_cache_queries
                             if s.prefix_cache_queries else None for s in prefill],
                         disaggregated=transfer)


def describe_transfers(figures: dict) -> str:
    """One line of a disaggregated run's KV transfers (DisaggregatedSimulator's figures)."""
    ms = figures["transfer_ms"]
    took = (f"first token to blocks on the decode side: mean {ms['mean']:.1f} ms, p99 "
            f"{ms['p99']:.1f} ms" if ms else "no transfer")
    busy = ", ".join(f"{b:.0%}" for b in figures["link_busy"])
    return (f"{figures['prefill_instances']} prefill + {figures['decode_instances']} decode "
            f"instances: {figures['transfers']} KV transfers, {figures['bytes'] / 1e6:.1f} MB "
            f"at {figures['bandwidth_gbps']:g} GB/s (+{figures['latency_ms']:g} ms); {took}; "
            f"links busy {busy}; {figures['received_tokens']} prompt tokens received, not "
            f"recomputed; routed {figures['routed_prefill']} / {figures['routed_decode']}")
