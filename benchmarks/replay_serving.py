"""What the server costs: a compare_serving trace served by `minivllm serve` against the same
trace replayed in-process on an `LLMEngine`, in alternating rounds.

    python benchmarks/replay_serving.py [--scenario greedy --rounds 3]

Served: compare_serving.py's run (minivllm serve, the engine core in its own process, the
trace sent by `minivllm bench serve` over HTTP with streaming). Replayed: one process, one
loop that adds each request when its arrival time (the same Poisson arrivals: the same
seeded trace) has come, steps the engine and timestamps each request's first and last
token; prompts are random token ids of the same lengths, EOS ignored, the same sampling.
Printed per round and as medians: output tok/s, TTFT p50 / p99, TPOT p50, and served /
replayed. The difference is the frontend's cost: HTTP, tokenization and detokenization
in another process, the ZeroMQ hops, streaming, and the client sharing the cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

from minivllm import LLM, SamplingParams
from minivllm.bench.models import save_random_model
from minivllm.bench.server_process import stop_server
from minivllm.bench.serving_scenarios import (
    SCENARIOS,
    bench,
    describe,
    one_scenario,
    start_named,
)
from minivllm.bench.throughput import random_prompts
from minivllm.bench.workload import random_trace
from minivllm.sampling_params import RequestOutputKind

ROOT = Path(__file__).resolve().parents[1]


def replay(model: Path, spec: dict, max_model_len: int) -> dict:
    """The trace on an in-process LLMEngine, arrivals on the wall clock."""
    llm = LLM(str(model), dtype="float32", max_model_len=max_model_len)
    engine = llm.llm_engine
    trace = random_trace(spec["num_prompts"], spec["input_len"], spec["output_len"],
                         spec["request_rate"], seed=0).entries
    vocab = llm.get_tokenizer().vocab_size
    prompts = random_prompts(len(trace), spec["input_len"], vocab, seed=spec["prompt_seed"])
    params = SamplingParams(max_tokens=spec["output_len"], ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA, **spec["sampling"])
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    arrival: dict[str, float] = {}
    start_time = time.perf_counter()
    added = 0
    while added < len(trace) or engine.has_unfinished_requests():
        now = time.perf_counter() - start_time
        while added < len(trace) and trace[added].send_time <= now:
            request_id = str(added)
            arrival[request_id] = trace[added].send_time
            engine.add_request(request_id, None, params, prompt_token_ids=prompts[added])
            added += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(trace[added].send_time - now, 0.0))
            continue
        for output in engine.step():
            stamp = time.perf_counter() - start_time
            if output.outputs and output.outputs[0].token_ids:
                first.setdefault(output.request_id, stamp)
                last[output.request_id] = stamp
    ttft = [1000 * (first[r] - arrival[r]) for r in arrival]
    tpot = [1000 * (last[r] - first[r]) / (spec["output_len"] - 1) for r in arrival]
    duration = max(last.values())
    return {"output_token_throughput": len(arrival) * spec["output_len"] / duration,
            "ttft_ms": {"median": float(np.median(ttft)), "p99": float(np.percentile(ttft, 99))},
            "tpot_ms": {"median": float(np.median(tpot))}}


def row(name: str, s: dict) -> str:
    return (f"| {name} | {s['output_token_throughput']:.1f} | {s['ttft_ms']['median']:.0f} / "
            f"{s['ttft_ms']['p99']:.0f} | {s['tpot_ms']['median']:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=str(ROOT / "results" / "smollm-135m-random"))
    parser.add_argument("--scenario", choices=list(SCENARIOS), default="greedy")
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=8150)
    parser.add_argument("--output", default=str(ROOT / "results" / "replay_serving"))
    args = parser.parse_args()
    model = save_random_model("smollm-135m", Path(args.model_dir))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    spec, max_model_len = one_scenario(args.scenario, args.num_prompts)
    print(f"{args.scenario}: {describe(spec)}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
          f", load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    served, replayed = [], []
    for round_index in range(args.rounds):
        print(f"round {round_index + 1}: served ...", flush=True)
        proc, _ = start_named("minivllm", ROOT, model, args.port, max_model_len,
                              out / "server.log")
        try:
            served.append(bench(ROOT, args.port, model, spec, "completions",
                                out / f"round{round_index + 1}"))
        finally:
            stop_server(proc)
        print(f"round {round_index + 1}: replayed in-process ...", flush=True)
        replayed.append(replay(model, spec, max_model_len))
        print(row("served", served[-1]) + "\n" + row("replayed", replayed[-1]), flush=True)
    ratios = [s["output_token_throughput"] / r["output_token_throughput"]
              for s, r in zip(served, replayed)]
    print(f"\ndone {time.strftime('%H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}\n\n"
          "| run | output tok/s | TTFT p50 / p99 ms | TPOT p50 ms |\n|---|---|---|---|")
    med = statistics.median
    for name, runs in (("served", served), ("replayed", replayed)):
        print(row(name, {"output_token_throughput": med(r["output_token_throughput"]
                                                        for r in runs),
                         "ttft_ms": {q: med(r["ttft_ms"][q] for r in runs)
                                     for q in ("median", "p99")},
                         "tpot_ms": {"median": med(r["tpot_ms"]["median"] for r in runs)}}))
    print(f"\nserved / replayed output tok/s: median {med(ratios):.2f} "
          f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
