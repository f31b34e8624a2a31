"""DataParallelClient: the EngineCoreClient of N engine-core replicas on Ray (`minivllm
serve --data-parallel-size N`), under the same AsyncLLM as a single engine core.

Two collaborators, one job each: RequestRouting (request_routing.py) sends each request to
the replica the router picks and its aborts to the replica holding it; ReplicaSupervisor
(replica_supervisor.py) starts the replicas, waits for them to be ready, notices a death and
has Ray restart the replica, and stops them. This client joins them: each replica streams
its steps back on its own socket, all polled at once, so a replica busy with a long step
holds up none of the others' streams: their EngineCoreOutputs are merged into one stream for
AsyncLLM, each tagged with its replica (the stats are recorded per replica:
DataParallelMetrics). Text (tokenization, detokenization, stop strings) stays in AsyncLLM,
in one OutputProcessor for all replicas.

When a replica dies (its process killed, a crash, an error in a step), the requests it had
produced nothing for are routed again, those it was running are lost (RequestsLost: they
fail with RequestFailedError, never hang), /health says degraded, and Ray restarts the actor
(max_restarts); once its new engine core says it is ready, the router takes it back and the
requests parked meanwhile are sent. Only when every replica is gone for good is the engine
dead (the server then exits non-zero, as with one engine core).
"""
from __future__ import annotations

import logging

import zmq
import zmq.asyncio

from minivllm.config import EngineConfig
from minivllm.core.router import make_router
from minivllm.core.scheduler_stats import SchedulerStats, sum_stats
from minivllm.distributed.dp_metrics import DataParallelMetrics
from minivllm.distributed.ray_replica import ReplicaClient
from minivllm.distributed.replica_supervisor import ReplicaSupervisor
from minivllm.distributed.request_routing import RequestRouting
from minivllm.engine.core_client import STARTUP_TIMEOUT_S, ClientEvent, EngineOutputs, RequestsLost
from minivllm.engine.errors import EngineDeadError
from minivllm.engine.messages import (
    EngineCoreDead,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    EngineCoreTracing,
)
from minivllm.engine.stat_loggers import StatLoggerBase

logger = logging.getLogger(__name__)


class DataParallelClient:
    def __init__(self, config: EngineConfig, data_parallel_size: int, *,
                 router_policy: str = "cache_aware", ray_address: str | None = None,
                 engine_threads: int | None = None, max_restarts: int = 3,
                 sticky_sessions: bool = False) -> None:
        self.config, self.size = config, data_parallel_size
        router = make_router(router_policy, data_parallel_size, config.block_size,
                             cache_capacity_blocks=config.num_kv_blocks,
                             sticky_sessions=sticky_sessions)
        self.router_policy = router_policy
        self._pending: list[ClientEvent] = []  # the replicas' outputs, and requests lost
        self.metrics: DataParallelMetrics | None = None  # once max_model_len is known
        self.supervisor = ReplicaSupervisor(
            config, data_parallel_size, on_down=self._replica_down, ray_address=ray_address,
            engine_threads=engine_threads, max_restarts=max_restarts)
        replicas = self.supervisor.replicas
        try:
            self.routing = RequestRouting(router, [r.sockets for r in replicas],
                                          on_routed=self._record_routed)
            self._poller = zmq.asyncio.Poller()
            self._by_socket = {}
            for replica in replicas:
                self._poller.register(replica.sockets.readable, zmq.POLLIN)
                self._by_socket[replica.sockets.readable] = replica
        except BaseException:
            self.close()
            raise

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> int:
        try:
            max_model_len = self.supervisor.wait_ready(timeout)
        except BaseException:
            self.close()
            raise
        self.metrics = DataParallelMetrics(self.config.model_name, max_model_len, self.size,
                                           self.router_policy)
        for i in range(self.size):
            self.metrics.set_up(i, True)
        logger.info("%d engine replicas on Ray, router policy %s", self.size,
                    self.router_policy)
        return max_model_len

    def make_stat_loggers(self, model_name: str, max_model_len: int) -> list[StatLoggerBase]:
        """One logger for every replica: a stats line each plus a total, one /metrics page
        with an `engine` label; the router's counters beside them."""
        return [self.metrics]

    def replica_states(self) -> list[dict]:
        return self.supervisor.states()

    def death(self) -> str | None:
        return None  # get_outputs says when every replica is gone

    # ---- requests -----------------------------------------------------------------------

    def add_request(self, request: EngineCoreRequest) -> None:
        self.routing.add(request)

    def _record_routed(self, replica: int, prefix_hit_tokens: int) -> None:
        self.metrics.record_routed(replica, prefix_hit_tokens)

    def abort_requests(self, request_ids: list[str], stopped: bool = False) -> None:
        self.routing.abort(request_ids, stopped)

    def release(self, request_ids: list[str]) -> None:
        self.routing.release(request_ids)

    def set_tracing(self, enabled: bool, interval: float) -> None:
        for replica in self.supervisor.replicas:
            replica.sockets.send(EngineCoreTracing(enabled, interval))

    async def get_stats(self) -> SchedulerStats:
        """The replicas' latest SchedulerStats, added up."""
        return sum_stats(self.metrics.last)

    async def reset_prefix_cache(self, reset_external: bool = False) -> bool:
        # Each replica would have to answer, and the cache-aware router forget its picture
        # of what they hold: neither is done yet.
        raise NotImplementedError("POST /reset_prefix_cache is not supported with "
                                  "--data-parallel-size > 1")

    # ---- the replicas' messages ---------------------------------------------------------

    async def get_outputs(self, timeout: float) -> list[ClientEvent]:
        """Every replica's messages, as soon as any has one, and the requests lost since the
        last call (a watcher's news waits for the poll: up to `timeout`)."""
        self.supervisor.ensure_watching()
        if not self._pending and self.supervisor.dead is None:
            for socket, _ in await self._poller.poll(int(timeout * 1000)):
                self._receive_all(self._by_socket[socket])
        events, self._pending = self._pending, []
        if not events and self.supervisor.dead is not None:
            raise EngineDeadError(self.supervisor.dead)
        return events

    def _receive_all(self, replica: ReplicaClient) -> None:
        while (msg := replica.sockets.recv_nowait()) is not None:
            self._handle(replica, msg)

    def _handle(self, replica: ReplicaClient, msg) -> None:
        index = replica.index
        if isinstance(msg, EngineCoreOutputs):
            self.routing.record_step(index, msg)
            self._pending.append(EngineOutputs(msg, index))
        elif isinstance(msg, EngineCoreReady):  # back after a restart
            self.supervisor.mark_up(replica)
            self.metrics.set_up(index, True)
            self.routing.replica_up(index)
        elif isinstance(msg, EngineCoreDead):  # its run call returns next: the supervisor's
            logger.error("engine replica %d failed: %s", index, msg.reason)
            replica.reason = msg.reason

    def _replica_down(self, replica: ReplicaClient, reason: str) -> None:
        """The supervisor saw it go (Ray restarts it): its requests go elsewhere or fail."""
        self._receive_all(replica)  # what it said before it went
        index = replica.index
        self.metrics.set_up(index, False)
        rerouted, lost = self.routing.replica_down(index)
        if lost:
            self._pending.append(RequestsLost(
                lost, f"engine replica {index} died while running this request: {reason}"))
        logger.error("engine replica %d is down: %s; %d request(s) routed again, %d failed",
                     index, reason, rerouted, len(lost))

    def close(self) -> None:
        self.supervisor.close()
