"""`minivllm` command line: one subcommand per module, each adding its own parser."""

from __future__ import annotations

import argparse
import sys

from minivllm.entrypoints import cli_generate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minivllm", description="minivllm: a small vLLM")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (cli_generate,):
        module.add_parser(subparsers)
    args = parser.parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
