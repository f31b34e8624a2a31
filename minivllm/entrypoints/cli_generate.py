"""`minivllm generate --model DIR "prompt"`: print a completion."""

from __future__ import annotations

import argparse

from minivllm.entrypoints.engine_args import add_engine_args, config_from_args


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="complete a prompt offline and print it")
    parser.add_argument("prompt", nargs="+", help="prompt text (several prompts: one batch)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--sampling-seed", type=int, default=None, help="per-request seed")
    parser.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")
    add_engine_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from minivllm import LLM, SamplingParams

    config = config_from_args(args)
    llm = LLM(**config.to_kwargs())
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, min_p=args.min_p, seed=args.sampling_seed, stop=args.stop,
        ignore_eos=args.ignore_eos)
    for output in llm.generate(args.prompt, params, use_tqdm=False):
        print(output.prompt + output.outputs[0].text)
    return 0
