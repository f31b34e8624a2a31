"""`minivllm` command line: one subcommand per module, each adding its own parser.

A bad flag, path or value ends with its message and exit status 2 (argparse's convention),
not a traceback: `--debug` (or `--log-level debug`) shows the traceback too."""

from __future__ import annotations

import argparse
import logging
import sys

from minivllm.bench import check_kernels
from minivllm.bench import cli as bench_cli
from minivllm.entrypoints import cli_generate
from minivllm.entrypoints.openai import cli_serve
from minivllm.sim import cli as sim_cli

LOG_LEVELS = ("debug", "info", "warning", "error")
# What the user got wrong: engine and server settings raise ValueError naming the flag, a
# model or template path that cannot be read raises OSError.
USER_ERRORS = (ValueError, OSError)


def _add_log_args(parser: argparse.ArgumentParser, default_level: str) -> None:
    """On every leaf command (`serve`, `bench serve`, ...), where its other flags go."""
    nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if nested:
        for sub in nested[0].choices.values():
            _add_log_args(sub, default_level)
        return
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=default_level,
                        help=f"logging level (default: {default_level}); debug also shows "
                             "the traceback of an error")
    parser.add_argument("--debug", action="store_true", help="same as --log-level debug")


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser (tests read the commands' flags from it)."""
    parser = argparse.ArgumentParser(prog="minivllm", description="minivllm: a small vLLM")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (cli_generate, cli_serve, bench_cli, sim_cli, check_kernels):
        module.add_parser(subparsers)
    for name, sub in subparsers.choices.items():
        # The server's log is its output; elsewhere only warnings interrupt the results.
        _add_log_args(sub, "info" if name == "serve" else "warning")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.debug:
        args.log_level = "debug"
    logging.basicConfig(level=args.log_level.upper(), format=cli_serve.LOG_FORMAT,
                        datefmt="%m-%d %H:%M:%S")
    try:
        return args.func(args) or 0
    except SystemExit as e:  # a command's own refusal, SystemExit("message"): a usage error
        if not isinstance(e.code, str):
            raise
        print(f"minivllm {args.command}: error: {e.code}", file=sys.stderr)
        return 2
    except USER_ERRORS as e:
        if args.log_level == "debug":
            raise
        print(f"minivllm {args.command}: error: {e}\n(--debug shows the traceback)",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
