"""ReplicaSupervisor: the life of DataParallelClient's engine-core replicas on Ray — their
start (on a local Ray cluster of our own unless --ray-address names one), the ready
handshake, each one's death and Ray's restart of it, and their shutdown.

A replica's death comes through its `run` call, which ends only when its engine core does:
the process killed, a crash, an error in a step. The supervisor then tells its owner
(`on_down`: what the replica's requests become is the router's business, request_routing.py)
and has Ray restart the actor (max_restarts); the restarted engine core's EngineCoreReady
arrives with the replica's outputs, where its owner reads it (mark_up). When every replica
is gone for good, `dead` says so.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from minivllm.config import EngineConfig
from minivllm.distributed.ray_replica import ReplicaClient, import_ray, make_actor_class
from minivllm.engine.core_client import log_format
from minivllm.engine.core_handshake import wait_core_ready
from minivllm.engine.inbox import call_soon
from minivllm.engine.messages import EngineCoreShutdown

logger = logging.getLogger(__name__)

_RESTART_TIMEOUT_S = 300.0  # how long Ray may take to bring a dead replica back


class ReplicaSupervisor:
    def __init__(self, config: EngineConfig, size: int, *,
                 on_down: Callable[[ReplicaClient, str], None],
                 ray_address: str | None = None, engine_threads: int | None = None,
                 max_restarts: int = 3) -> None:
        ray = self._ray = import_ray()
        self._on_down = on_down
        self._stopped = False
        self._watchers: list[asyncio.Task] = []
        self.dead: str | None = None  # every replica is gone for good
        if ray_address is None:  # a local cluster of our own, on loopback only
            ray.init(num_cpus=max(os.cpu_count() or 1, size * (engine_threads or 1)),
                     include_dashboard=False, _node_ip_address="127.0.0.1",
                     configure_logging=False)
            host = "127.0.0.1"
        else:
            ray.init(address=ray_address, configure_logging=False)
            host = ray.util.get_node_ip_address()
        try:
            actor_class = make_actor_class(ray, engine_threads, max_restarts)
            self.replicas = [
                ReplicaClient(i, actor_class.remote(config, engine_threads, *log_format()), host)
                for i in range(size)]
            # The actor runs one call at a time, and `run` lasts: ask for its pid first.
            pids = ray.get([r.actor.pid.remote() for r in self.replicas])
            for replica, pid in zip(self.replicas, pids):
                replica.pid = pid
                replica.start()
        except BaseException:
            self.close()
            raise

    def wait_ready(self, timeout: float) -> int:
        """Block until every replica is up; their smallest max_model_len."""
        return min(self._wait_ready(r, timeout) for r in self.replicas)

    def _wait_ready(self, replica: ReplicaClient, timeout: float) -> int:
        ray = self._ray

        def exit_reason() -> str | None:
            if not ray.wait([replica.run_ref], timeout=0)[0]:
                return None
            ray.get(replica.run_ref)  # raises the actor's death
            return f"engine replica {replica.index} exited during startup"

        max_model_len = wait_core_ready(replica.sockets, timeout, exit_reason,
                                        f"engine replica {replica.index}")
        replica.state = "up"
        return max_model_len

    def mark_up(self, replica: ReplicaClient) -> None:
        """Its engine core is ready again after a restart."""
        replica.state = "up"
        logger.warning("engine replica %d is back (process %s)", replica.index, replica.pid)

    def states(self) -> list[dict]:
        return [{"engine": r.index, "state": r.state, "pid": r.pid, "reason": r.reason}
                for r in self.replicas]

    def ensure_watching(self) -> None:
        """The replicas' watchers, on the caller's loop (again on a new one)."""
        if self._watchers and not any(t.done() for t in self._watchers):
            return
        for task in self._watchers:
            task.cancel()
        loop = asyncio.get_running_loop()
        self._watchers = [loop.create_task(self._watch(r)) for r in self.replicas]

    async def _watch(self, replica: ReplicaClient) -> None:
        """Await the replica's `run` call: it ends only when the replica stops or dies."""
        ray = self._ray
        while not self._stopped:
            try:
                code = await replica.run_ref
                reason = replica.reason or f"its engine core loop ended (status {code})"
                alive = True
            except Exception as e:  # RayActorError: the process is gone; Ray restarts it
                reason, alive = f"its process died ({type(e).__name__})", False
            if self._stopped:
                return
            self._on_down(replica, reason)  # it reads what the replica said before it went
            replica.state, replica.reason = "down", reason
            if alive:  # the loop failed but the process lives: let Ray restart it
                ray.kill(replica.actor, no_restart=False)
            try:
                replica.pid = await self._restarted_pid(replica)
            except Exception as e:  # no restart left
                replica.state = "failed"
                logger.error("engine replica %d will not be restarted: %s", replica.index, e)
                if all(r.state == "failed" for r in self.replicas):
                    self.dead = "every engine replica has died"
                return
            logger.warning("engine replica %d restarted by Ray (process %d); starting its "
                           "engine core", replica.index, replica.pid)
            replica.start()

    async def _restarted_pid(self, replica: ReplicaClient) -> int:
        """The process id of the actor Ray brought back. While Ray is still restarting it,
        calls fail with ActorUnavailableError (retried, up to _RESTART_TIMEOUT_S); any other
        error means no restart is left."""
        deadline = time.monotonic() + _RESTART_TIMEOUT_S
        while True:
            try:
                return await replica.actor.pid.remote()
            except self._ray.exceptions.ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

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
            replica.sockets.send(EngineCoreShutdown())
        refs = [r.run_ref for r in replicas if r.run_ref is not None]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=10)
        for replica in replicas:
            ray.kill(replica.actor, no_restart=True)
            replica.sockets.close()
        ray.shutdown()
        logger.info("engine replicas and Ray stopped")
