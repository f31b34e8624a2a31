"""The engine core's busy loop, the one loop that drives an EngineCore wherever it runs: in a
process of its own (`minivllm serve`, --engine-mode process: run_engine_core, between two
ZeroMQ sockets), on a thread of the API server (--engine-mode thread: inproc_client.py, on
in-memory queues) or in a Ray actor (data parallel: distributed/ray_replica.py, on TCP
sockets).

Inputs (adds, aborts, utility calls, tracing) are applied in order; while there is work the
loop steps without waiting and sends one EngineCoreOutputs per step; when idle it blocks on
its input. It never dies for one request: input the core rejects comes back as that
request's error output. It dies for an error in step() (or at start), after sending
EngineCoreDead with the reason; the frontend (async_llm.py) fails what is in flight.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

import msgspec
import zmq

from minivllm.config import EngineConfig
from minivllm.engine.errors import EngineOverloadedError
from minivllm.engine.messages import (
    EngineCoreAbort,
    EngineCoreDead,
    EngineCoreInput,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    EngineCoreShutdown,
    EngineCoreTracing,
    EngineCoreUtility,
    UtilityResult,
)

logger = logging.getLogger(__name__)

UTILITY_METHODS = ("get_stats", "reset_prefix_cache")
# How long an idle core blocks on its input before it checks that its frontend still lives.
IDLE_POLL_MS = 1000
_SEND_LINGER_MS = 2000  # at exit, how long the last messages may wait for the frontend

# receive(timeout_ms): the next input, or None when none came within the timeout (0: none
# is queued now).
Receive = Callable[[int], EngineCoreInput | None]
Send = Callable[[object], None]


def start_engine_core(config: EngineConfig, engine_threads: int | None, send: Send):
    """An EngineCore for the busy loop, announced with EngineCoreReady; None (after
    EngineCoreDead with the reason) if it could not start."""
    try:
        import torch

        from minivllm.engine.core import EngineCore

        if engine_threads:  # before the runner starts: its thread governor caps at this
            torch.set_num_threads(engine_threads)
        core = EngineCore(config)
    except ValueError as e:  # a bad setting: the server reports it, the traceback is noise
        logger.debug("the engine core failed to start", exc_info=True)
        send(EngineCoreDead(str(e), bad_config=True))
        return None
    except Exception as e:
        logger.exception("the engine core failed to start")
        send(EngineCoreDead(f"the engine core failed to start: {type(e).__name__}: {e}"))
        return None
    send(EngineCoreReady(max_model_len=core.max_model_len))
    logger.info("engine core ready in process %d (%d torch threads)", os.getpid(),
                torch.get_num_threads())
    return core


def serve_engine_core(config: EngineConfig, engine_threads: int | None, receive: Receive,
                      send: Send, frontend_alive: Callable[[], bool] = lambda: True) -> int:
    """Start an engine core and run its busy loop: 0 after EngineCoreShutdown, 1 when it
    could not start or failed."""
    core = start_engine_core(config, engine_threads, send)
    if core is None:
        return 1
    gc.freeze()  # the model and tokenizer live as long as the process: no collection walks them
    return run_busy_loop(core, receive, send, frontend_alive)


def run_busy_loop(core, receive: Receive, send: Send,
                  frontend_alive: Callable[[], bool] = lambda: True) -> int:
    """Drive `core` until EngineCoreShutdown (0), its failure or its frontend's end (1)."""
    try:
        while True:
            timeout = 0 if core.has_unfinished_requests() else IDLE_POLL_MS
            changed, rejected = False, []
            while (msg := receive(timeout)) is not None:
                timeout = 0  # take whatever else is queued, without waiting
                if isinstance(msg, EngineCoreShutdown):
                    core.shutdown()
                    return 0
                changed = True
                _apply(core, msg, rejected, send)
            if not frontend_alive():  # nobody reads our outputs
                logger.error("the API server is gone: the engine core stops")
                return 1
            if core.has_unfinished_requests():
                step = core.step()
                step.outputs = rejected + step.outputs
                send(step)
            elif changed:  # rejections to answer, or aborts whose freed blocks stats show
                now = time.time()
                send(EngineCoreOutputs(timestamp=now, outputs=rejected,
                                       scheduler_stats=core.get_stats(),
                                       trace=core.take_trace(now, force=True)))
    except Exception as e:
        logger.exception("the engine core failed")
        send(EngineCoreDead(f"engine core failed: {type(e).__name__}: {e}"))
        return 1


def _apply(core, msg: EngineCoreInput, rejected: list[EngineCoreOutput], send: Send) -> None:
    if isinstance(msg, EngineCoreRequest):
        try:
            core.add_request(msg)
        except EngineOverloadedError as e:
            rejected.append(EngineCoreOutput(msg.request_id, finish_reason="abort", error=str(e),
                                             error_kind="overloaded", overload_reason=e.reason))
        except ValueError as e:
            rejected.append(EngineCoreOutput(msg.request_id, finish_reason="abort", error=str(e),
                                             error_kind="invalid"))
        except Exception as e:  # input no check foresaw: this request's failure alone
            logger.exception("request %s was rejected", msg.request_id)
            rejected.append(EngineCoreOutput(msg.request_id, finish_reason="abort",
                                             error=f"{type(e).__name__}: {e}",
                                             error_kind="failed"))
    elif isinstance(msg, EngineCoreAbort):
        core.abort_requests(msg.request_ids, stopped=msg.stopped)
    elif isinstance(msg, EngineCoreTracing):
        core.set_tracing(msg.enabled, msg.interval)
    elif isinstance(msg, EngineCoreUtility):
        if msg.method not in UTILITY_METHODS:
            send(UtilityResult(msg.call_id, error=f"unknown utility method {msg.method!r}"))
            return
        try:
            result = getattr(core, msg.method)(**msg.kwargs)
        except Exception as e:  # the caller's failure (a bad argument), not the engine's
            logger.exception("utility call %s failed", msg.method)
            send(UtilityResult(msg.call_id, error=f"{msg.method}: {type(e).__name__}: {e}"))
            return
        send(UtilityResult(msg.call_id, result=result))


def socket_receive(inputs: zmq.Socket) -> Receive:
    """receive() over a ZeroMQ PULL socket carrying msgpack."""
    decoder = msgspec.msgpack.Decoder(EngineCoreInput)

    def receive(timeout_ms: int) -> EngineCoreInput | None:
        if not inputs.poll(timeout_ms):
            return None
        return decoder.decode(inputs.recv())

    return receive


def connect_sockets(context: zmq.Context, input_addr: str, output_addr: str
                    ) -> tuple[zmq.Socket, zmq.Socket, Send]:
    """The core's ends of the frontend's two sockets, and send() over the output one."""
    inputs = context.socket(zmq.PULL)
    inputs.connect(input_addr)
    outputs = context.socket(zmq.PUSH)
    outputs.setsockopt(zmq.SNDHWM, 0)  # a send never blocks, even with the frontend gone
    outputs.setsockopt(zmq.LINGER, _SEND_LINGER_MS)
    outputs.connect(output_addr)
    encoder = msgspec.msgpack.Encoder()
    return inputs, outputs, lambda msg: outputs.send(encoder.encode(msg))


def run_engine_core(config: EngineConfig, input_addr: str, output_addr: str,
                    engine_threads: int | None, log_level: int, log_format: str | None,
                    log_datefmt: str | None) -> None:
    """The engine-core process's entry point (multiprocessing, spawn)."""
    # The frontend decides when we stop (EngineCoreShutdown, after its drain): a SIGTERM or
    # Ctrl-C sent to the whole process group must not cut in-flight requests short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format=log_format, datefmt=log_datefmt)
    context = zmq.Context()
    inputs, outputs, send = connect_sockets(context, input_addr, output_addr)
    parent = os.getppid()
    try:
        code = serve_engine_core(config, engine_threads, socket_receive(inputs), send,
                                 frontend_alive=lambda: os.getppid() == parent)
    finally:
        inputs.close(linger=0)
        outputs.close()
        context.term()
    # Exit without the interpreter's teardown of torch and the model (about 4 s here, which
    # every server stop waited for); the sockets are closed and the logs flushed above.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
