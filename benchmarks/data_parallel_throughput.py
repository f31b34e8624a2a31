"""Throughput of `minivllm serve --data-parallel-size 2` (two engine-core replicas on a local
Ray cluster) against one engine core, on a saturated trace, in alternating rounds.

    python benchmarks/data_parallel_throughput.py [--model minivllm-demo --rounds 2]

Both servers run side by side for the whole run (each started once; idle, an engine core
blocks on its socket); each round sends the same seeded trace -- random prompts, every
request at once (`--request-rate inf`), EOS ignored -- with `minivllm bench serve` to one
server, then the other. Printed per round and as medians: output tok/s and N=2 / N=1.
Needs ray (make install-ray). A replica is a process with its own torch threads: on a
machine with fewer free cores than replicas x --engine-threads they only share them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from minivllm.bench.server_process import free_port, start_server, stop_server

ROOT = Path(__file__).resolve().parent.parent


def start(model: str, size: int, args, log: Path) -> tuple[subprocess.Popen, int, float]:
    port = free_port()
    command = [sys.executable, "-m", "minivllm.cli", "serve", model,
               "--port", str(port), "--engine-threads", str(args.engine_threads),
               "--max-num-seqs", str(args.max_num_seqs), "--data-parallel-size", str(size),
               "--log-interval", "30"]
    proc, ready_s = start_server(command, log, f"http://127.0.0.1:{port}", cwd=ROOT,
                                 env={"OMP_NUM_THREADS": str(args.engine_threads)})
    return proc, port, ready_s


def bench(port: int, model: str, args, out: Path) -> dict:
    command = [sys.executable, "-m", "minivllm.cli", "bench", "serve",
               "--base-url", f"http://127.0.0.1:{port}", "--model", model,
               "--workload", "random", "--seed", "0", "--num-prompts", str(args.num_prompts),
               "--request-rate", "inf", "--input-len", str(args.input_len),
               "--output-len", str(args.output_len), "--output", str(out), "--disable-tqdm"]
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads((out / "run.json").read_text())["summary"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minivllm-demo")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--engine-threads", type=int, default=1)
    parser.add_argument("--output", default=str(ROOT / "results" / "data_parallel"))
    args = parser.parse_args()
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {load}, "
          f"{os.cpu_count()} cores; {args.num_prompts} requests at once, {args.input_len} in / "
          f"{args.output_len} out, {args.model}, --engine-threads {args.engine_threads}, "
          f"--max-num-seqs {args.max_num_seqs} per replica")
    servers = {}
    try:
        for size in (1, 2):
            proc, port, took = start(args.model, size, args, out / f"server-n{size}.log")
            servers[size] = (proc, port)
            print(f"N={size} ready in {took:.0f} s")
        rates: dict[int, list[float]] = {1: [], 2: []}
        for round_ in range(args.rounds):
            for size in (1, 2):
                summary = bench(servers[size][1], args.model, args,
                                out / f"round{round_}-n{size}")
                assert summary["completed"] == args.num_prompts, summary
                rates[size].append(summary["output_token_throughput"])
                print(f"round {round_ + 1}, N={size}: {rates[size][-1]:.1f} "
                      f"output tok/s (load {os.getloadavg()[0]:.1f})")
        n1, n2 = statistics.median(rates[1]), statistics.median(rates[2])
        print(f"median: N=1 {n1:.1f}, N=2 {n2:.1f} output tok/s; N=2 / N=1 = {n2 / n1:.2f}")
    finally:
        for proc, _ in servers.values():
            stop_server(proc)  # the server stops its replicas and its Ray cluster


if __name__ == "__main__":
    main()
