"""Speculative decoding with a draft model, served: minivllm and llama.cpp's `llama-server`
on the same target and draft GGUF files, each without drafts and with them, one client for
all (`minivllm bench serve`, the prompts of benchmarks/data/spec_prompts_code.jsonl as chat
messages, greedy, each answer ending at EOS or --max-tokens), at batch 1 and concurrency 8.

    python benchmarks/spec_serving.py      # Qwen2.5-Coder-1.5B drafted by the 0.5B
    python benchmarks/spec_serving.py --rounds 3 --max-prompts 4 --concurrency 1 8 \
        --draft-max 3 8 --k 4

Engines (alternating within each round, one server at a time):
- `minivllm`: no drafts; `minivllm-draft`: `--speculative-config '{"method": "draft_model",
  "model": DRAFT, "num_speculative_tokens": K}'` (prompt lookup's drafts first where
  found, the adaptive draft length); `minivllm-draft-only`: the same, "prompt_lookup": false;
- `llama-server`: no drafts; `llama-server-md`: `-md DRAFT` with its defaults;
  `llama-server-md-N`: `-md DRAFT --spec-draft-n-max N` for each --draft-max N (its tuning).
Workloads: each kind of the prompt file (repeat: copy and edit; open: chat; complete: code
completion), the first --max-prompts of its dev split. Per engine, workload and
concurrency: output tok/s and TPOT p50 (medians over the rounds), the ratio to the same
server without drafts and to llama-server's best drafting configuration, round by round.
Outputs are the engines' own greedy answers (llama.cpp's numerics are not minivllm's: their
lengths can differ; tok/s counts what each produced).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from minivllm.bench.machine import cpu_description, when_and_load
from minivllm.bench.qwen25_coder import qwen25_coder_gguf
from minivllm.bench.server_process import free_port, start_server, stop_server

ROOT = Path(__file__).resolve().parents[1]
LLAMA_SERVER = ROOT / "peers" / "llama.cpp" / "build" / "bin" / "llama-server"
PROMPTS = Path(__file__).resolve().parent / "data" / "spec_prompts_code.jsonl"


def engines(args) -> dict[str, list[str]]:
    """name -> the server's command line after its port, model and context flags."""
    spec = {"method": "draft_model", "model": str(args.draft),
            "num_speculative_tokens": args.k}
    out = {
        "minivllm": [],
        "minivllm-draft": ["--speculative-config", json.dumps(spec)],
        "minivllm-draft-only": ["--speculative-config",
                                json.dumps({**spec, "prompt_lookup": False})],
        "llama-server": [],
        "llama-server-md": ["-md", str(args.draft)],
    }
    for n in args.draft_max:
        out[f"llama-server-md-{n}"] = ["-md", str(args.draft), "--spec-draft-n-max", str(n)]
    return {name: flags for name, flags in out.items()
            if not args.engines or name in args.engines}


def command(name: str, flags: list[str], model: Path, port: int, args) -> list[str]:
    ctx, slots = 4096, max(args.concurrency)
    if name.startswith("minivllm"):
        return [sys.executable, "-m", "minivllm.cli", "serve", str(model), "--port", str(port),
                "--max-model-len", str(ctx), "--max-num-seqs", str(slots),
                "--num-threads", str(args.threads), *flags]
    # -c is the context of all slots together; the draft model runs on the same threads
    return [str(LLAMA_SERVER), "-m", str(model), "--port", str(port), "-np", str(slots),
            "-c", str(ctx * slots), "-t", str(args.threads), *flags]


def bench(port: int, prompts: Path, concurrency: int, args, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "minivllm.cli", "bench", "serve",
                    "--base-url", f"http://127.0.0.1:{port}", "--workload", f"custom:{prompts}",
                    "--disable-shuffle", "--custom-output-len", str(args.max_tokens),
                    "--num-prompts", str(max(concurrency, args.max_prompts)),
                    "--max-concurrency", str(concurrency), "--temperature", "0",
                    "--output", str(out), "--disable-tqdm"],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    s = json.loads((out / "run.json").read_text())["summary"]
    return {"tok/s": s["output_token_throughput"], "tpot_ms": s["tpot_ms"]["median"]}


def one_round(names: dict[str, list[str]], model: Path, workloads: dict[str, Path], args,
              work: Path) -> dict:
    results = {}
    for name, flags in names.items():
        port = free_port()
        proc, _ = start_server(command(name, flags, model, port, args), work / f"{name}.log",
                               f"http://127.0.0.1:{port}", cwd=ROOT)
        try:
            bench(port, next(iter(workloads.values())), 1, args, work / "warmup")
            for workload, prompts in workloads.items():
                for c in args.concurrency:
                    results[name, workload, c] = bench(port, prompts, c, args,
                                                       work / f"{name}-{workload}-{c}")
        finally:
            stop_server(proc)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None,
                   help="the target GGUF file (default: Qwen2.5-Coder-1.5B-Instruct Q4_K_M)")
    p.add_argument("--draft", type=Path, default=None,
                   help="the draft GGUF file (default: Qwen2.5-Coder-0.5B-Instruct Q4_K_M)")
    p.add_argument("--engines", nargs="+", default=None, help="default: every one above")
    p.add_argument("--k", type=int, default=4, help="minivllm's num_speculative_tokens")
    p.add_argument("--draft-max", nargs="*", type=int, default=[8],
                   help="llama-server -md --spec-draft-n-max values tried beside its default")
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    p.add_argument("--workloads", nargs="+", default=["repeat", "open", "complete"])
    p.add_argument("--max-prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    if not LLAMA_SERVER.exists():
        sys.exit(f"{LLAMA_SERVER} is missing: build it with `make peer-llama-server`")
    model = args.model or qwen25_coder_gguf("1.5b")
    args.draft = args.draft or qwen25_coder_gguf("0.5b")
    names = engines(args)
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    print(f"# {model.name} drafted by {args.draft.name}: {cpu_description()}; "
          f"{args.threads} threads each")
    print(f"# {when_and_load()} (start)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        workloads = {}
        for kind in args.workloads:
            prompts = [r for r in rows if r["kind"] == kind and r["split"] == "dev"]
            workloads[kind] = work / f"{kind}.jsonl"
            workloads[kind].write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n"
                                               for r in prompts[:args.max_prompts]))
        rounds = [one_round(names, model, workloads, args, work) for _ in range(args.rounds)]
    print(f"# {when_and_load()} (end); {args.rounds} rounds, engines alternating, greedy, "
          f"at most {args.max_tokens} tokens an answer")
    print("| workload | concurrency | engine | out tok/s | TPOT p50 ms | vs no drafts "
          "| vs llama-server's best drafting |")
    print("|---|---|---|---|---|---|---|")
    llama_md = [n for n in names if n.startswith("llama-server-md")]
    for workload in args.workloads:
        for c in args.concurrency:
            def key(r: dict, n: str, workload=workload, c=c) -> float:
                return r[n, workload, c]["tok/s"]

            for name in names:
                runs = [r[name, workload, c] for r in rounds]
                base = "minivllm" if name.startswith("minivllm") else "llama-server"
                ratio = (f"{statistics.median(key(r, name) / key(r, base) for r in rounds):.2f}x"
                         if base in names else "")
                vs_peer = ""
                if llama_md and name.startswith("minivllm"):
                    ratios = [key(r, name) / max(key(r, n) for n in llama_md) for r in rounds]
                    vs_peer = " / ".join(f"{x:.2f}" for x in ratios)
                print(f"| {workload} | {c} | {name} "
                      f"| {statistics.median(run['tok/s'] for run in runs):.1f} "
                      f"| {statistics.median(run['tpot_ms'] for run in runs):.1f} | {ratio} "
                      f"| {vs_peer} |")


if __name__ == "__main__":
    main()
