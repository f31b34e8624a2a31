"""`minivllm` command line: one subcommand per module, each adding its own parser."""

from __future__ import annotations

import argparse
import sys

from minivllm.bench import cli as bench_cli
from minivllm.entrypoints import cli_generate
from minivllm.entrypoints.openai import cli_serve
from minivllm.sim import cli as sim_cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minivllm", description="minivllm: a small vLLM")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (cli_generate, cli_serve, bench_cli, sim_cli):
        module.add_parser(subparsers)
    args = parser.parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
