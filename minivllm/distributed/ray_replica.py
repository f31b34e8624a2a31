"""One data-parallel engine replica: an EngineCore in a Ray actor, and its client in the API
server.

The actor runs the engine core's busy loop (core_proc.serve_engine_core) on two ZeroMQ
sockets over TCP that the frontend binds, so a replica streams its steps exactly as the
single-process engine core does, on any machine of the Ray cluster. Ray places the actor
(`num_cpus` = --engine-threads), notices when its process dies and restarts it
(`max_restarts`); the frontend learns both from the actor's `run` call, which returns only
when the loop ends and raises when the process is gone.

`ray` is imported only here and in replica_supervisor.py (ReplicaSupervisor): it is an
optional extra.
"""

from __future__ import annotations

import logging
import os

import zmq

from minivllm.config import EngineConfig
from minivllm.engine.core_sockets import CoreSockets

logger = logging.getLogger(__name__)

INSTALL_HINT = ("--data-parallel-size > 1 runs the replicas on Ray, which is not installed: "
                "pip install 'minivllm[ray]' (or: make install-ray)")


def import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    return ray


class EngineCoreActor:
    """The Ray actor (wrapped by ray.remote in make_actor_class). Cheap to construct, so that
    Ray's restart of a dead one is quick; the engine starts in `run`."""

    def __init__(self, config: EngineConfig, engine_threads: int | None, log_level: int,
                 log_format: str | None, log_datefmt: str | None) -> None:
        logging.basicConfig(level=log_level, format=log_format, datefmt=log_datefmt)
        self.config, self.engine_threads = config, engine_threads

    def pid(self) -> int:
        """Answers once the actor (again) exists: the frontend's readiness probe."""
        return os.getpid()

    def run(self, input_addr: str, output_addr: str) -> int:
        """The engine core's loop until EngineCoreShutdown (0) or its failure (1)."""
        from minivllm.engine.core_proc import connect_sockets, serve_engine_core, socket_receive

        context = zmq.Context()
        inputs, outputs, send = connect_sockets(context, input_addr, output_addr)
        try:
            return serve_engine_core(self.config, self.engine_threads, socket_receive(inputs),
                                     send)
        finally:
            inputs.close(linger=0)
            outputs.close()
            context.term()


def make_actor_class(ray, engine_threads: int | None, max_restarts: int):
    return ray.remote(num_cpus=engine_threads or 1, max_restarts=max_restarts,
                      max_task_retries=0)(EngineCoreActor)


class ReplicaClient:
    """The frontend's end of one replica: the actor handle, its `run` call, the two sockets
    (bound here: the actor connects, again after each restart) and its state."""

    def __init__(self, index: int, actor, host: str) -> None:
        self.index, self.actor = index, actor
        self.sockets = CoreSockets()
        self.input_addr, self.output_addr = self.sockets.bind_to_random_ports(host)
        self.run_ref = None  # the running `run` call: done when the loop ends or the actor dies
        self.pid: int | None = None
        self.state = "starting"  # up | down (Ray restarts it) | failed (for good)
        self.reason: str | None = None  # why it went down last

    def start(self) -> None:
        self.run_ref = self.actor.run.remote(self.input_addr, self.output_addr)
