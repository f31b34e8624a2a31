"""DataParallelAsyncLLM: the API server's client of N engine-core replicas on Ray
(`minivllm serve --data-parallel-size N`), with AsyncLLM's public surface.

Each request goes where the router (core/router.py, --router-policy) sends it; the replica
streams its steps back on its own socket, read by a task of its own, so a replica busy with
a long step holds up none of the others' streams. Text (tokenization, detokenization, stop
strings) stays here, in one OutputProcessor for all replicas.

When a replica dies (its process killed, a crash, an error in a step), Ray tells us through
its `run` call: the requests it had produced nothing for are routed again, those it was
running fail with RequestFailedError (their streams end with an error, never hang), /health
says degraded, and Ray restarts the actor (max_restarts); once its new engine core says it
is ready, the router takes it back. Only when every replica is gone for good is the engine
dead (the server then exits non-zero, as with one engine core).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from transformers import AutoTokenizer

from minivllm.config import EngineConfig
from minivllm.core.router import make_router
from minivllm.distributed.dp_metrics import DataParallelMetrics, sum_stats
from minivllm.distributed.ray_replica import ReplicaClient, import_ray, make_actor_class
from minivllm.engine.core_client import _log_format
from minivllm.engine.errors import EngineDeadError, RequestFailedError
from minivllm.engine.frontend import TURNED_AWAY, CoreFrontend, request_error, turned_away_error
from minivllm.engine.messages import (
    EngineCoreAbort,
    EngineCoreDead,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreShutdown,
)
from minivllm.engine.output_processor import OutputProcessor
from minivllm.engine.stats import SchedulerStats
from minivllm.model.loader import resolve_model_path
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_STARTUP_TIMEOUT_S = 600.0
_POLL_MS = 1000
_RESTART_TIMEOUT_S = 300.0  # how long Ray may take to bring a dead replica back


class _Replica:
    def __init__(self, client: ReplicaClient) -> None:
        self.client = client
        self.state = "starting"  # up | down (Ray restarts it) | failed (for good)
        self.requests: set[str] = set()  # routed here and not finished
        self.reason: str | None = None  # why it went down last


class DataParallelAsyncLLM(CoreFrontend):
    def __init__(self, config: EngineConfig, data_parallel_size: int, *,
                 router_policy: str = "cache_aware", ray_address: str | None = None,
                 engine_threads: int | None = None, log_interval: float = 5.0,
                 max_restarts: int = 3) -> None:
        super().__init__()
        ray = self._ray = import_ray()
        self.config, self.size = config, data_parallel_size
        path = resolve_model_path(config.model, config.revision)
        tokenizer_path = resolve_model_path(config.tokenizer) if config.tokenizer else path
        self.router = make_router(router_policy, data_parallel_size, config.block_size,
                                  cache_capacity_blocks=config.num_kv_blocks)
        self.log_interval = log_interval
        self._stopped = False
        self._sent: dict[str, tuple[bytes, list[int], str | None]] = {}  # for re-routing
        self._owner: dict[str, int] = {}  # request id -> replica
        self._started: set[str] = set()  # a replica has produced output for it
        self._parked: list[str] = []  # to route once a replica is up again
        self._tasks: list[asyncio.Task] = []
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
                                                              *_log_format()), host))
                for i in range(data_parallel_size)]
            # The actor runs one call at a time, and `run` lasts: ask for its pid first.
            pids = ray.get([r.client.actor.pid.remote() for r in self.replicas])
            for replica, pid in zip(self.replicas, pids):
                replica.client.pid = pid
                replica.client.start()
            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
            self._processor = OutputProcessor(self.tokenizer)
            self.max_model_len = min(self._wait_ready(r) for r in self.replicas)
        except BaseException:
            self._stop_replicas()
            raise
        self.metrics = DataParallelMetrics(config.model_name, self.max_model_len,
                                           data_parallel_size, router_policy)
        self.stat_loggers = [self.metrics]
        for i in range(data_parallel_size):
            self.metrics.set_up(i, True)
        logger.info("%d engine replicas on Ray, router policy %s", data_parallel_size,
                    router_policy)

    def _wait_ready(self, replica: _Replica) -> int:
        client, ray = replica.client, self._ray
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if client.poll(100):
                msg = client.recv_nowait()
                if isinstance(msg, EngineCoreDead):
                    raise (ValueError if msg.bad_config else RuntimeError)(msg.reason)
                if isinstance(msg, EngineCoreReady):
                    replica.state = "up"
                    return msg.max_model_len
            elif ray.wait([client.run_ref], timeout=0)[0]:
                ray.get(client.run_ref)  # raises the actor's death
                raise RuntimeError(f"engine replica {client.index} exited during startup")
        raise RuntimeError(f"engine replica {client.index} did not start in "
                           f"{_STARTUP_TIMEOUT_S:.0f}s")

    # ---- state --------------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return not self.errored

    @property
    def crashed(self) -> bool:
        return self._crashed

    def replica_states(self) -> list[dict]:
        """For /health: each replica's state, process id and why it last went down."""
        return [{"engine": i, "state": r.state, "pid": r.client.pid, "reason": r.reason}
                for i, r in enumerate(self.replicas)]

    # ---- requests -----------------------------------------------------------------------

    async def generate(self, prompt: str | None, params: SamplingParams, request_id: str,
                       prompt_token_ids: list[int] | None = None, priority: int = 0,
                       cache_salt: str | None = None, **core_fields
                       ) -> AsyncIterator[RequestOutput]:
        """As AsyncLLM.generate; `core_fields` are EngineCoreRequest's other fields."""
        self._ensure_started()
        request, data, stream = self._open_request(prompt, params, request_id, prompt_token_ids,
                                                   priority=priority, cache_salt=cache_salt,
                                                   **core_fields)
        # _dispatch sends it from here: again if its replica dies before it starts.
        self._sent[request_id] = (data, request.prompt_token_ids, cache_salt)
        self._dispatch(request_id)
        async with aclosing(self._outputs(request_id, stream)) as outputs:
            async for output in outputs:
                yield output

    def _dispatch(self, request_id: str) -> None:
        """Route a request and send it; parked while no replica is up."""
        data, token_ids, cache_salt = self._sent[request_id]
        try:
            decision = self.router.route(token_ids, cache_salt)
        except RuntimeError:  # every replica is down: Ray is restarting them
            self._parked.append(request_id)
            return
        replica = self.replicas[decision.replica]
        replica.requests.add(request_id)
        self._owner[request_id] = decision.replica
        self.metrics.record_routed(decision.replica, decision.prefix_hit_tokens)
        replica.client.send_bytes(data)

    def _abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is None:
            return
        self._processor.abort_requests([request_id])
        owner = self._owner.get(request_id)
        self._forget(request_id)
        if owner is not None and not self.errored:
            self.replicas[owner].client.send(EngineCoreAbort([request_id]))

    def _forget(self, request_id: str) -> None:
        self._sent.pop(request_id, None)
        self._started.discard(request_id)
        owner = self._owner.pop(request_id, None)
        if owner is not None:
            self.replicas[owner].requests.discard(request_id)
        if request_id in self._parked:
            self._parked.remove(request_id)

    async def get_stats(self) -> SchedulerStats:
        """The replicas' latest SchedulerStats, added up."""
        return sum_stats(self.metrics.last)

    # ---- the replicas' messages ---------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._tasks and not any(t.done() for t in self._tasks):
            return
        for task in self._tasks:
            task.cancel()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read(r)) for r in self.replicas]
        self._tasks += [loop.create_task(self._watch(r)) for r in self.replicas]
        self._tasks.append(loop.create_task(self._log_stats()))

    async def _read(self, replica: _Replica) -> None:
        while not self.errored:
            if await replica.client.wait_readable(_POLL_MS):
                self._receive_all(replica)

    def _receive_all(self, replica: _Replica) -> None:
        while not self.errored and (msg := replica.client.recv_nowait()) is not None:
            self._handle(replica, msg)

    async def _log_stats(self) -> None:
        while not self.errored:
            await asyncio.sleep(self.log_interval)
            self.metrics.log()

    def _handle(self, replica: _Replica, msg) -> None:
        index = replica.client.index
        if isinstance(msg, EngineCoreOutputs):
            self._handle_outputs(index, msg)
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

    def _handle_outputs(self, index: int, msg: EngineCoreOutputs) -> None:
        count_rejected = functools.partial(self.metrics.record_rejected, engine=index)
        for out in msg.outputs:
            if out.error_kind in TURNED_AWAY:
                self._processor.discard(out.request_id)
                stream = self._streams.pop(out.request_id, None)
                self._forget(out.request_id)
                error = turned_away_error(out, count_rejected)
                if stream is not None:
                    stream.put_nowait(error)
            else:
                self._started.add(out.request_id)
        processed = self._processor.process_outputs(msg)
        client = self.replicas[index].client
        if processed.stopped:
            client.send(EngineCoreAbort(processed.stopped, stopped=True))
        if processed.failed:
            client.send(EngineCoreAbort(processed.failed))
        for output in processed.request_outputs:
            stream = self._streams.get(output.request_id)
            if output.finished or output.error is not None:
                self._streams.pop(output.request_id, None)
                self._forget(output.request_id)
            if stream is not None:
                stream.put_nowait(output if output.error is None
                                  else request_error(output, count_rejected))
        if msg.scheduler_stats is not None:
            s = msg.scheduler_stats
            self.router.update_stats(index, s.num_running, s.num_waiting, s.kv_cache_usage)
            self.metrics.record_engine(index, s, processed.iteration_stats)

    # ---- a replica's death and return -----------------------------------------------------

    async def _watch(self, replica: _Replica) -> None:
        """Await the replica's `run` call: it ends only when the replica stops or dies."""
        ray, client = self._ray, replica.client
        while not self.errored:
            try:
                code = await client.run_ref
                reason = replica.reason or f"its engine core loop ended (status {code})"
                alive = True
            except Exception as e:  # RayActorError: the process is gone; Ray restarts it
                reason, alive = f"its process died ({type(e).__name__})", False
            if self.errored:
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
                    self._die("every engine replica has died", crashed=True)
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
        rerouted, failed = [], []
        for request_id in list(replica.requests):
            replica.requests.discard(request_id)
            self._owner.pop(request_id, None)
            if request_id in self._started:  # its client has had output: it cannot move
                failed.append(request_id)
                stream = self._streams.pop(request_id, None)
                self._processor.discard(request_id)
                self._forget(request_id)
                if stream is not None:
                    stream.put_nowait(RequestFailedError(
                        f"engine replica {index} died while running this request: {reason}"))
            elif request_id in self._streams:
                rerouted.append(request_id)
                self._dispatch(request_id)
        logger.error("engine replica %d is down: %s; %d request(s) routed again, %d failed",
                     index, reason, len(rerouted), len(failed))

    # ---- the end ------------------------------------------------------------------------

    def _die(self, reason: str, crashed: bool) -> None:
        if self.errored:
            return
        self.errored, self._crashed, self.dead_reason = True, crashed, reason
        error = EngineDeadError(reason)
        for stream in self._streams.values():
            stream.put_nowait(error)
        self._streams.clear()
        current = asyncio.current_task() if _loop_running() else None
        for task in self._tasks:
            if task is not current:
                task.cancel()

    async def drain(self, timeout: float) -> int:
        self.draining = True
        cut = await self._wait_in_flight(timeout)
        self._die("the server shut down before the request finished", crashed=False)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.to_thread(self._stop_replicas)
        return cut

    def shutdown(self, reason: str = "engine shut down") -> None:
        self._die(reason, crashed=False)
        self._stop_replicas()

    def _stop_replicas(self) -> None:
        """Stop every engine core, kill the actors, and the Ray cluster if we started it."""
        if self._stopped:
            return
        self._stopped = True
        ray = self._ray
        replicas = getattr(self, "replicas", [])
        for replica in replicas:
            replica.client.send(EngineCoreShutdown())
        refs = [r.client.run_ref for r in replicas if r.client.run_ref is not None]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=10)
        for replica in replicas:
            ray.kill(replica.client.actor, no_restart=True)
            replica.client.close()
        ray.shutdown()
        logger.info("engine replicas and Ray stopped")


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
