"""DataParallelClient: the EngineCoreClient of N engine-core replicas on Ray (`minivllm
serve --data-parallel-size N`), under the same AsyncLLM as a single engine core.

Each request goes where the router (core/router.py, --router-policy; with
--sticky-sessions, a `user` back to its replica) sends it, and its aborts go to the replica
holding it; each replica streams its steps back on its own socket,
all polled at once, so a replica busy with a long step holds up none of the others'
streams: their EngineCoreOutputs are merged into one stream for AsyncLLM, each tagged with
its replica (the stats are recorded per replica: DataParallelMetrics). Text (tokenization,
detokenization, stop strings) stays in AsyncLLM, in one OutputProcessor for all replicas.

When a replica dies (its process killed, a crash, an error in a step), Ray tells us through
its `run` call: the requests it had produced nothing for are routed again, those it was
running are lost (RequestsLost: they fail with RequestFailedError, never hang), /health says
degraded, and Ray restarts the actor (max_restarts); once its new engine core says it is
ready, the router takes it back and the requests parked meanwhile are sent. Only when every
replica is gone for good is the engine dead (the server then exits non-zero, as with one
engine core).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import msgspec
import zmq
import zmq.asyncio

from minivllm.config import EngineConfig
from minivllm.core.router import make_router
from minivllm.core.scheduler_stats import SchedulerStats, sum_stats
from minivllm.distributed.dp_metrics import DataParallelMetrics
from minivllm.distributed.ray_replica import ReplicaClient, import_ray, make_actor_class
from minivllm.engine.core_client import (
    STARTUP_TIMEOUT_S,
    ClientEvent,
    EngineOutputs,
    RequestsLost,
    log_format,
)
from minivllm.engine.errors import EngineDeadError
from minivllm.engine.inbox import call_soon
from minivllm.engine.messages import (
    EngineCoreAbort,
    EngineCoreDead,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    EngineCoreShutdown,
    EngineCoreTracing,
)
from minivllm.engine.stat_loggers import StatLoggerBase

logger = logging.getLogger(__name__)

_RESTART_TIMEOUT_S = 300.0  # how long Ray may take to bring a dead replica back


class _Replica:
    def __init__(self, client: ReplicaClient) -> None:
        self.client = client
        self.state = "starting"  # up | down (Ray restarts it) | failed (for good)
        self.requests: set[str] = set()  # routed here and not finished
        self.reason: str | None = None  # why it went down last


class DataParallelClient:
    def __init__(self, config: EngineConfig, data_parallel_size: int, *,
                 router_policy: str = "cache_aware", ray_address: str | None = None,
                 engine_threads: int | None = None, max_restarts: int = 3,
                 sticky_sessions: bool = False) -> None:
        ray = self._ray = import_ray()
        self.config, self.size = config, data_parallel_size
        self.router = make_router(router_policy, data_parallel_size, config.block_size,
                                  cache_capacity_blocks=config.num_kv_blocks,
                                  sticky_sessions=sticky_sessions)
        self.router_policy = router_policy
        self._stopped = False
        self._dead: str | None = None  # every replica is gone for good
        self._sent: dict[str, EngineCoreRequest] = {}  # not finished: routed again if need be
        self._encoded: dict[str, bytes] = {}
        self._owner: dict[str, int] = {}  # request id -> replica
        self._started: set[str] = set()  # a replica has produced output for it
        self._parked: list[str] = []  # to route once a replica is up again
        self._watchers: list[asyncio.Task] = []
        self._pending: list[ClientEvent] = []  # the replicas' outputs, and requests lost
        self._encoder = msgspec.msgpack.Encoder()
        self.metrics: DataParallelMetrics | None = None  # once max_model_len is known
        if ray_address is None:  # a local cluster of our own, on loopback only
            ray.init(num_cpus=max(os.cpu_count() or 1, data_parallel_size * (engine_threads or 1)),
                     include_dashboard=False, _node_ip_address="127.0.0.1",
                     configure_logging=False)
            host = "127.0.0.1"
        else:
            ray.init(address=ray_address, configure_logging=False)
            host = ray.util.get_node_ip_address()
        try:
            actor_class = make_actor_class(ray, engine_threads, max_restarts)
            self.replicas = [
                _Replica(ReplicaClient(i, actor_class.remote(config, engine_threads,
                                                              *log_format()), host))
                for i in range(data_parallel_size)]
            # The actor runs one call at a time, and `run` lasts: ask for its pid first.
            pids = ray.get([r.client.actor.pid.remote() for r in self.replicas])
            for replica, pid in zip(self.replicas, pids):
                replica.client.pid = pid
                replica.client.start()
            self._poller = zmq.asyncio.Poller()
            self._by_socket = {}
            for replica in self.replicas:
                self._poller.register(replica.client.sockets.readable, zmq.POLLIN)
                self._by_socket[replica.client.sockets.readable] = replica
        except BaseException:
            self.close()
            raise

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> int:
        try:
            max_model_len = min(self._wait_ready(r, timeout) for r in self.replicas)
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

    def _wait_ready(self, replica: _Replica, timeout: float) -> int:
        client, ray = replica.client, self._ray
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if client.sockets.poll(100):
                msg = client.sockets.recv_nowait()
                if isinstance(msg, EngineCoreDead):
                    raise (ValueError if msg.bad_config else RuntimeError)(msg.reason)
                if isinstance(msg, EngineCoreReady):
                    replica.state = "up"
                    return msg.max_model_len
            elif ray.wait([client.run_ref], timeout=0)[0]:
                ray.get(client.run_ref)  # raises the actor's death
                raise RuntimeError(f"engine replica {client.index} exited during startup")
        raise RuntimeError(f"engine replica {client.index} did not start in {timeout:.0f}s")

    def make_stat_loggers(self, model_name: str, max_model_len: int) -> list[StatLoggerBase]:
        """One logger for every replica: a stats line each plus a total, one /metrics page
        with an `engine` label; the router's counters beside them."""
        return [self.metrics]

    def replica_states(self) -> list[dict]:
        return [{"engine": i, "state": r.state, "pid": r.client.pid, "reason": r.reason}
                for i, r in enumerate(self.replicas)]

    def death(self) -> str | None:
        return None  # get_outputs says when every replica is gone

    # ---- requests -----------------------------------------------------------------------

    def add_request(self, request: EngineCoreRequest) -> None:
        try:
            data = self._encoder.encode(request)
        except (OverflowError, msgspec.EncodeError) as e:  # JSON allows ints msgpack does not
            raise ValueError(f"a request field is out of range: {e}") from e
        # _dispatch sends it from here: again if its replica dies before it starts.
        self._sent[request.request_id] = request
        self._encoded[request.request_id] = data
        self._dispatch(request.request_id)

    def _dispatch(self, request_id: str) -> None:
        """Route a request and send it; parked while no replica is up."""
        request = self._sent[request_id]
        try:
            decision = self.router.route(request.prompt_token_ids, request.prefix_cache_key,
                                         request.user)
        except RuntimeError:  # every replica is down: Ray is restarting them
            self._parked.append(request_id)
            return
        replica = self.replicas[decision.replica]
        replica.requests.add(request_id)
        self._owner[request_id] = decision.replica
        self.metrics.record_routed(decision.replica, decision.prefix_hit_tokens)
        replica.client.sockets.send_bytes(self._encoded[request_id])

    def abort_requests(self, request_ids: list[str], stopped: bool = False) -> None:
        """Each to the replica holding it (a sequence id: its request's)."""
        by_replica: dict[int, list[str]] = {}
        for seq_id in request_ids:
            owner = self._owner.get(seq_id)
            if owner is None:  # a sequence of n > 1: "request_id#index" (messages.seq_id)
                owner = self._owner.get(seq_id.rpartition("#")[0])
            if owner is not None:
                by_replica.setdefault(owner, []).append(seq_id)
        for owner, ids in by_replica.items():
            self.replicas[owner].client.sockets.send(EngineCoreAbort(ids, stopped=stopped))

    def release(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._sent.pop(request_id, None)
            self._encoded.pop(request_id, None)
            self._started.discard(request_id)
            owner = self._owner.pop(request_id, None)
            if owner is not None:
                self.replicas[owner].requests.discard(request_id)
            if request_id in self._parked:
                self._parked.remove(request_id)

    def set_tracing(self, enabled: bool, interval: float) -> None:
        for replica in self.replicas:
            replica.client.sockets.send(EngineCoreTracing(enabled, interval))

    async def get_stats(self) -> SchedulerStats:
        """The replicas' latest SchedulerStats, added up."""
        return sum_stats(self.metrics.last)

    # ---- the replicas' messages ---------------------------------------------------------

    async def get_outputs(self, timeout: float) -> list[ClientEvent]:
        """Every replica's messages, as soon as any has one, and the requests lost since the
        last call (a watcher's news waits for the poll: up to `timeout`)."""
        self._ensure_watching()
        if not self._pending and self._dead is None:
            for socket, _ in await self._poller.poll(int(timeout * 1000)):
                self._receive_all(self._by_socket[socket])
        events, self._pending = self._pending, []
        if not events and self._dead is not None:
            raise EngineDeadError(self._dead)
        return events

    def _ensure_watching(self) -> None:
        """The replicas' watchers, on the caller's loop (again on a new one)."""
        if self._watchers and not any(t.done() for t in self._watchers):
            return
        for task in self._watchers:
            task.cancel()
        loop = asyncio.get_running_loop()
        self._watchers = [loop.create_task(self._watch(r)) for r in self.replicas]

    def _receive_all(self, replica: _Replica) -> None:
        while (msg := replica.client.sockets.recv_nowait()) is not None:
            self._handle(replica, msg)

    def _handle(self, replica: _Replica, msg) -> None:
        index = replica.client.index
        if isinstance(msg, EngineCoreOutputs):
            for out in msg.outputs:
                self._started.add(out.request_id)
            s = msg.scheduler_stats
            if s is not None:
                self.router.update_stats(index, s.num_running, s.num_waiting, s.kv_cache_usage)
            self._pending.append(EngineOutputs(msg, index))
        elif isinstance(msg, EngineCoreReady):  # back after a restart
            replica.state = "up"
            self.router.set_available(index, True)
            self.metrics.set_up(index, True)
            logger.warning("engine replica %d is back (process %s)", index, replica.client.pid)
            parked, self._parked = self._parked, []
            for request_id in parked:
                self._dispatch(request_id)
        elif isinstance(msg, EngineCoreDead):  # its run call returns next: _watch handles it
            logger.error("engine replica %d failed: %s", index, msg.reason)
            replica.reason = msg.reason

    # ---- a replica's death and return -----------------------------------------------------

    async def _watch(self, replica: _Replica) -> None:
        """Await the replica's `run` call: it ends only when the replica stops or dies."""
        ray, client = self._ray, replica.client
        while not self._stopped:
            try:
                code = await client.run_ref
                reason = replica.reason or f"its engine core loop ended (status {code})"
                alive = True
            except Exception as e:  # RayActorError: the process is gone; Ray restarts it
                reason, alive = f"its process died ({type(e).__name__})", False
            if self._stopped:
                return
            self._receive_all(replica)  # what it said before it went
            self._replica_down(replica, reason)
            if alive:  # the loop failed but the process lives: let Ray restart it
                ray.kill(client.actor, no_restart=False)
            try:
                client.pid = await self._restarted_pid(client)
            except Exception as e:  # no restart left
                replica.state = "failed"
                logger.error("engine replica %d will not be restarted: %s", client.index, e)
                if all(r.state == "failed" for r in self.replicas):
                    self._dead = "every engine replica has died"
                return
            logger.warning("engine replica %d restarted by Ray (process %d); starting its "
                           "engine core", client.index, client.pid)
            client.start()

    async def _restarted_pid(self, client) -> int:
        """The process id of the actor Ray brought back. While Ray is still restarting it,
        calls fail with ActorUnavailableError (retried, up to _RESTART_TIMEOUT_S); any other
        error means no restart is left."""
        deadline = time.monotonic() + _RESTART_TIMEOUT_S
        while True:
            try:
                return await client.actor.pid.remote()
            except self._ray.exceptions.ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    def _replica_down(self, replica: _Replica, reason: str) -> None:
        index = replica.client.index
        replica.state, replica.reason = "down", reason
        self.router.set_available(index, False)
        self.metrics.set_up(index, False)
        rerouted, lost = [], []
        for request_id in list(replica.requests):
            replica.requests.discard(request_id)
            self._owner.pop(request_id, None)
            if request_id in self._started:  # its client has had output: it cannot move
                lost.append(request_id)
            elif request_id in self._sent:
                rerouted.append(request_id)
                self._dispatch(request_id)
        if lost:
            self._pending.append(RequestsLost(
                lost, f"engine replica {index} died while running this request: {reason}"))
        logger.error("engine replica %d is down: %s; %d request(s) routed again, %d failed",
                     index, reason, len(rerouted), len(lost))

    # ---- the end ------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every engine core, kill the actors, and the Ray cluster if we started it."""
        if self._stopped:
            return
        self._stopped = True
        for task in self._watchers:  # from the drain's thread, or the loop itself
            if not task.get_loop().is_closed():
                call_soon(task.get_loop(), task.cancel)
        ray = self._ray
        replicas = getattr(self, "replicas", [])
        for replica in replicas:
            replica.client.sockets.send(EngineCoreShutdown())
        refs = [r.client.run_ref for r in replicas if r.client.run_ref is not None]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=10)
        for replica in replicas:
            ray.kill(replica.client.actor, no_restart=True)
            replica.client.sockets.close()
        ray.shutdown()
        logger.info("engine replicas and Ray stopped")
