"""This tree against another checkout of minivllm (a refactor's "performance within noise"),
same machine, same run, rounds alternating A B A B:

    git worktree add ../baseline <commit>
    python benchmarks/compare_revisions.py --baseline ../baseline [--rounds 3]

Two measurements per round and tree, on random weights in SmolLM-135M's shape (or --model's
file, e.g. a GGUF; batch-1 decode: --model F --num-prompts 1 --skip-serving):
- offline: `minivllm bench throughput` (LLM.generate, --num-prompts prompts of --input-len
  tokens, --output-len tokens each, greedy, EOS ignored): output tok/s;
- serving: `minivllm serve` (the default engine mode) under this tree's `bench serve`
  (--serve-prompts random requests, all sent at once, 8 at a time): output tok/s and mean TTFT;
- greedy, or --temperature / --top-p for both.
Prints every round, and the median ratio this tree / baseline, with the CPU and load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from minivllm.bench.machine import cpu_description, when_and_load
from minivllm.bench.models import save_random_model
from minivllm.bench.server_process import free_port, start_server, stop_server

HERE = Path(__file__).resolve().parents[1]
# The command module moved (entrypoints/cli.py -> cli.py); run whichever the tree has.
LAUNCH = ("import sys; sys.argv[0] = 'minivllm'\n"
          "try:\n    from minivllm.cli import main\n"
          "except ImportError:\n    from minivllm.entrypoints.cli import main\n"
          "sys.exit(main())")


def minivllm(tree: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", LAUNCH, *args]


def env_for(tree: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": os.environ.get(
        "OMP_NUM_THREADS", "2")}


def sampling(args) -> list[str]:
    """Greedy by default; --temperature / --top-p for what users send."""
    flags = ["--temperature", str(args.temperature)]
    return flags + (["--top-p", str(args.top_p)] if args.top_p is not None else [])


def offline(tree: Path, model: Path, args) -> float:
    out = subprocess.run(minivllm(tree, "bench", "throughput", "--model", str(model),
                                  "--num-prompts", str(args.num_prompts), "--input-len",
                                  str(args.input_len), "--output-len", str(args.output_len),
                                  *sampling(args)),
                         env=env_for(tree), capture_output=True, text=True, check=True)
    return float(re.search(r"([\d.]+) output tok/s", out.stdout).group(1))


def serving(tree: Path, model: Path, args) -> tuple[float, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        proc, _ = start_server(minivllm(tree, "serve", str(model), "--port", str(port)),
                               Path(tmp) / "server.log", url, env=env_for(tree))
        try:
            subprocess.run(minivllm(HERE, "bench", "serve", "--base-url", url,
                                    "--workload", "random", "--num-prompts",
                                    str(args.serve_prompts), "--input-len",
                                    str(args.input_len), "--output-len",
                                    str(args.output_len), "--max-concurrency", "8",
                                    *sampling(args), "--output", tmp, "--disable-tqdm"),
                           env=env_for(HERE), capture_output=True, check=True)
        finally:
            stop_server(proc)
        summary = json.loads((Path(tmp) / "run.json").read_text())["summary"]
    return summary["output_token_throughput"], summary["ttft_ms"]["mean"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", required=True, type=Path)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--serve-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--model-dir", default=str(HERE / "results" / "smollm-135m-random"))
    p.add_argument("--model", type=Path, help="this model (a directory or GGUF file) instead "
                   "of random SmolLM-135M weights")
    p.add_argument("--skip-serving", action="store_true", help="offline only")
    args = p.parse_args()
    model = args.model or save_random_model("smollm-135m", Path(args.model_dir))
    print(f"{when_and_load()}; {cpu_description()}, {os.cpu_count()} cores")
    trees = {"this": HERE, "baseline": args.baseline.resolve()}
    rows: dict[str, list] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name, tree in trees.items():
            off = offline(tree, model, args)
            tok, ttft = (float("nan"),) * 2 if args.skip_serving else serving(tree, model,
                                                                               args)
            rows[name].append((off, tok, ttft))
            print(f"round {r + 1} {name:8s}: offline {off:7.1f} tok/s, serving {tok:7.1f} "
                  f"tok/s, TTFT mean {ttft:7.0f} ms (load {os.getloadavg()[0]:.1f})",
                  flush=True)
    measured = ("offline tok/s",) if args.skip_serving else ("offline tok/s",
                                                              "serving tok/s", "TTFT mean")
    for i, what in enumerate(measured):
        ratios = [a[i] / b[i] for a, b in zip(rows["this"], rows["baseline"])]
        print(f"{what}: this / baseline median {statistics.median(ratios):.3f} "
              f"(rounds {', '.join(f'{x:.3f}' for x in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
