"""`minivllm serve MODEL`: the OpenAI-compatible server (uvicorn + FastAPI) around one
AsyncLLM, whose engine core runs in a process of its own (the default), on a thread
(--engine-mode thread) or as replicas on Ray (--data-parallel-size N)."""

from __future__ import annotations

import argparse
import gc
import logging
import os

from minivllm.entrypoints.engine_args import add_engine_args, config_from_args
from minivllm.entrypoints.llamacpp.cli_flags import add_llama_server_flags
from minivllm.entrypoints.openai.chat_completion.cli_args import add_tool_args, parsers_from_args
from minivllm.entrypoints.openai.limits import RequestLimits, add_limit_args
from minivllm.entrypoints.openai.models.serving import check_lora_modules
from minivllm.entrypoints.openai.responses.store import add_responses_args

logger = logging.getLogger("minivllm.serve")

ENGINE_MODES = ("process", "thread")  # the core in a process of its own, or on a thread

# vLLM's log layout: "INFO 05-19 11:22:57 [metrics.py:61] Avg prompt throughput: ..."
LOG_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible API")
    add_llama_server_flags(parser)  # -c, -np, -ngl, ...: refused, naming minivllm's flag
    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="model directory or hub id (same as --model)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: "
                        "127.0.0.1; 0.0.0.0 exposes the server to the network)")
    parser.add_argument("--port", type=int, default=8000, help="(default: 8000)")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on every route but /health "
                             "and /metrics")
    parser.add_argument("--metrics-require-key", action="store_true",
                        help="with --api-key, guard /metrics too (default: open, for scrapers)")
    parser.add_argument("--allowed-origins", nargs="+", default=None, metavar="ORIGIN",
                        help="answer CORS requests from these origins ('*' for any); "
                             "default: no CORS headers")
    parser.add_argument("--shutdown-timeout", type=float, default=20.0,
                        help="on SIGTERM, seconds for requests in flight to finish before they "
                             "are aborted (default: 20)")
    parser.add_argument("--chat-template", default=None,
                        help="Jinja chat template file (or the template itself) for tokenizers "
                             "that have none")
    parser.add_argument("--log-interval", type=float, default=5.0,
                        help="seconds between two stats log lines while busy (default: 5)")
    # The environment variable lets scripts that start servers compare the modes unchanged.
    parser.add_argument("--engine-mode", choices=ENGINE_MODES,
                        default=os.environ.get("MINIVLLM_ENGINE_MODE", "process"),
                        help="process: the scheduler and model run in an engine-core process "
                             "of their own, this one does HTTP, tokenization and "
                             "detokenization; thread: all in this process, the engine on a "
                             "thread (default: $MINIVLLM_ENGINE_MODE, else process)")
    parser.add_argument("--disable-dashboard", action="store_true",
                        help="do not serve the live dashboard page at /dashboard (its data, "
                             "GET /v1/engine/events, stays)")
    parser.add_argument("--dashboard-interval", type=_positive_float, default=1.0,
                        metavar="SECONDS", help="seconds between two dashboard snapshots "
                        "(default: 1)")
    parser.add_argument("--engine-threads", type=_positive_int, default=None, metavar="N",
                        help="torch threads of the engine (the thread governor may use fewer "
                             "while other processes keep cores busy); default: torch's")
    parser.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                        help="with --enable-lora, LoRA adapters (PEFT folders) served under "
                             "these names: name=path, or a JSON object {\"name\": ..., "
                             "\"path\": ..., \"base_model_name\": ...}")
    parser.add_argument("--allow-runtime-lora-updating", action="store_true",
                        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter "
                             "(also on with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True); default: "
                             "off, they answer 403")
    add_data_parallel_args(parser)
    add_limit_args(parser)
    add_tool_args(parser)
    add_responses_args(parser)
    add_engine_args(parser)
    parser.set_defaults(func=run)


def add_data_parallel_args(parser) -> None:
    from minivllm.core.router import DEFAULT_ROUTER_POLICY, ROUTER_POLICIES

    parser.add_argument("--data-parallel-size", type=_positive_int, default=1, metavar="N",
                        help="N engine-core replicas, each with its own KV cache, as Ray actors "
                             "behind the router (N > 1 needs: pip install 'minivllm[ray]'); "
                             "default: 1, no Ray")
    parser.add_argument("--data-parallel-backend", choices=("ray",), default="ray",
                        help="where the replicas run (default: ray)")
    parser.add_argument("--ray-address", default=None, metavar="auto|HOST:PORT",
                        help="join this Ray cluster (auto: the one on this machine); default: "
                             "start a local one, stopped with the server")
    parser.add_argument("--router-policy", choices=sorted(ROUTER_POLICIES),
                        default=DEFAULT_ROUTER_POLICY,
                        help="which replica serves a request (default: "
                             f"{DEFAULT_ROUTER_POLICY}: the longest cached prefix, unless that "
                             "replica is much busier than the least loaded)")
    parser.add_argument("--data-parallel-max-restarts", type=int, default=3, metavar="N",
                        help="times Ray restarts a replica that died (default: 3)")
    parser.add_argument("--sticky-sessions", action="store_true",
                        help="route a request with a `user` to the replica that served that "
                             "user last, while it is up and within the router's balance "
                             "threshold (default: off)")


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from prometheus_client import disable_created_metrics

    from minivllm.entrypoints.openai.api_server import build_app, load_chat_template
    from minivllm.entrypoints.openai.shutdown import ServingServer

    disable_created_metrics()  # as vLLM: no *_created series beside every counter
    if args.model_tag is not None:
        args.model = args.model_tag
    config = config_from_args(args)
    load_chat_template(args.chat_template)  # a bad path fails now, not on the first chat
    parsers_from_args(args)  # so does --enable-auto-tool-choice without a parser
    check_lora_modules(args.lora_modules, config)  # and a misspelt --lora-modules
    engine = make_engine(config, args)
    try:
        app = build_app(engine, args)
        logger.info("serving %s at http://%s:%d (OpenAI API under /v1; docs at /docs)",
                    config.model_name, args.host, args.port)
        # log_config=None: uvicorn's loggers (the access log among them) use the format above.
        # h11 buffers a few times the header limit, so that HeaderSizeLimitMiddleware answers.
        uvicorn_config = uvicorn.Config(
            app, host=args.host, port=args.port, log_config=None, access_log=True,
            timeout_graceful_shutdown=5,
            h11_max_incomplete_event_size=4 * RequestLimits.from_args(args).max_header_bytes)
        server = ServingServer(uvicorn_config, engine, args.shutdown_timeout)
        # What start-up built lives as long as the server: out of the collector's sight, no
        # collection walks it again (the one at exit took 7 s here).
        gc.freeze()
        server.run()
    finally:
        engine.shutdown()
    return server.exit_code


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def make_engine(config, args: argparse.Namespace):
    """The AsyncLLM over the engine-core client the flags name: Ray replicas for
    --data-parallel-size > 1, else --engine-mode's."""
    from minivllm.engine.async_llm import AsyncLLM

    if args.engine_mode not in ENGINE_MODES:  # argparse does not check a default
        raise ValueError(f"--engine-mode (MINIVLLM_ENGINE_MODE) must be one of "
                         f"{', '.join(ENGINE_MODES)}, got {args.engine_mode!r}")
    if args.data_parallel_size == 1:
        return AsyncLLM.from_config(config, log_interval=args.log_interval,
                                    engine_threads=args.engine_threads,
                                    engine_mode=args.engine_mode)
    if args.engine_mode == "thread":
        raise ValueError("--data-parallel-size > 1 runs engine-core replicas: it needs "
                         "--engine-mode process")
    from minivllm.distributed.ray_replica import import_ray

    import_ray()  # not installed: say how, before anything starts
    from minivllm.distributed.data_parallel import DataParallelClient
    from minivllm.model.loader import resolve_model_path

    resolve_model_path(config.model, config.revision)  # downloaded once, before the replicas
    client = DataParallelClient(
        config, args.data_parallel_size, router_policy=args.router_policy,
        ray_address=args.ray_address, engine_threads=args.engine_threads,
        max_restarts=args.data_parallel_max_restarts, sticky_sessions=args.sticky_sessions)
    return AsyncLLM.from_client(client, config, log_interval=args.log_interval)
