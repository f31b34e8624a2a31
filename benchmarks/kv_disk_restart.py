"""A long prefix across a server restart: the prefix cache's disk tier (issue 51's target).

    python benchmarks/kv_disk_restart.py [--model FILE.gguf] [--prefix-len 2048]

1. A server with `--kv-offloading-backend disk` on an empty folder serves PREFIX + question 1
   (its TTFT: cold), and is stopped (SIGTERM: the engine writes its cached blocks).
2. It is started again on the same folder and serves PREFIX + question 2: the prefix's blocks
   come from disk (TTFT: restarted).
3. A server without the tier serves PREFIX + question 2 (TTFT: cold, and the reference text).
Greedy, streamed (TTFT = the first token's arrival); the restarted answer must equal the
cold one. Default model: Qwen2.5-Coder-0.5B-Instruct Q4_K_M (its blocks), 2 threads.
Prints the CPU, the date and load; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import openai

from minivllm.bench.machine import cpu_description, when_and_load
from minivllm.bench.server_process import free_port, start_server, stop_server


def ask(port: int, model: str, prompt: list[int], max_tokens: int) -> tuple[float, list[str]]:
    """TTFT in seconds and the streamed text pieces of one greedy completion."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0)
    start, ttft, pieces = time.perf_counter(), None, []
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                           temperature=0, stream=True):
        if ttft is None:
            ttft = time.perf_counter() - start
        pieces.append(chunk.choices[0].text)
    client.close()
    return ttft, pieces


def serve(model: Path, port: int, work: Path, name: str, disk: Path | None, threads: int):
    command = [sys.executable, "-m", "minivllm.cli", "serve", str(model), "--port", str(port),
               "--max-model-len", "4096", "--num-threads", str(threads)]
    if disk is not None:
        command += ["--kv-offloading-backend", "disk", "--kv-offloading-path", str(disk)]
    proc, ready = start_server(command, work / f"{name}.log", f"http://127.0.0.1:{port}")
    return proc, ready


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--prefix-len", type=int, default=2048)
    parser.add_argument("--question-len", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.model is None:
        from minivllm.bench.qwen25_coder import qwen25_coder_gguf
        args.model = qwen25_coder_gguf()
    rng = random.Random(0)
    prefix = [rng.randrange(1000, 30000) for _ in range(args.prefix_len)]
    questions = [[rng.randrange(1000, 30000) for _ in range(args.question_len)]
                 for _ in range(2)]
    name = str(args.model)
    print(f"# {cpu_description()}; {args.threads} threads; {args.model.name}; prefix "
          f"{args.prefix_len} tokens + {args.question_len}, {args.max_tokens} out, greedy")
    print(f"# {when_and_load()} (start)")
    with tempfile.TemporaryDirectory() as tmp:
        work, disk = Path(tmp), Path(tmp) / "kv"
        port = free_port()
        proc, _ = serve(args.model, port, work, "first", disk, args.threads)
        try:
            first_ttft, _ = ask(port, name, prefix + questions[0], args.max_tokens)
        finally:
            stop_server(proc)
        files = sorted(disk.glob("*/*.kv"))
        size = sum(f.stat().st_size for f in files)
        proc, ready = serve(args.model, port, work, "restarted", disk, args.threads)
        try:
            warm_ttft, warm_text = ask(port, name, prefix + questions[1], args.max_tokens)
        finally:
            stop_server(proc)
        proc, _ = serve(args.model, port, work, "cold", None, args.threads)
        try:
            cold_ttft, cold_text = ask(port, name, prefix + questions[1], args.max_tokens)
        finally:
            stop_server(proc)
    print(f"# {when_and_load()} (end)")
    print(f"disk tier after the first server stopped: {len(files)} block files, "
          f"{size / 1e6:.1f} MB; the restarted server was ready in {ready:.1f} s")
    print("| run | TTFT |")
    print("|---|---|")
    print(f"| first server, prefix + question 1 (cold) | {first_ttft * 1e3:.0f} ms |")
    print(f"| restarted server, prefix + question 2 (prefix from disk) | "
          f"{warm_ttft * 1e3:.0f} ms |")
    print(f"| server without the tier, prefix + question 2 (cold) | {cold_ttft * 1e3:.0f} ms |")
    print(f"restarted / cold TTFT: {warm_ttft / cold_ttft:.1%}; greedy text identical: "
          f"{warm_text == cold_text}")


if __name__ == "__main__":
    main()
