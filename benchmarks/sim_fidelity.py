"""How close is `minivllm sim` to the real engine? The same traces through both, per bucket.

    python benchmarks/sim_fidelity.py [--model ../shared/models/stories260K]
        [--profile PATH] [--workloads seed-low seed-medium seed-high azure]

1. A profile is calibrated on this machine (`minivllm sim calibrate`'s code; or --profile).
2. Each workload (seed-* at CPU scale: length scale = context / 32768; `azure`: a slice of the
   shared Azure code trace, rows --azure-start.. +--azure-rows, arrivals --azure-time-scale)
   is replayed in real time through the real EngineCore (the scheduler and the model runner
   in this process, requests added when their send time comes, token times taken when each
   step returns: the engine, without the HTTP server in front) and through the simulator,
   which is given the engine's exact scheduler configuration and the profile.
3. Per bucket: mean and p90 TTFT and TPOT, engine beside simulator, with the relative error.

The issue's target: mean TTFT and mean TPOT per bucket each within 10%. Writes the table to
stdout and, with --output, as JSON. Date and load average are printed with it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections import deque
from pathlib import Path

import numpy as np

from minivllm.bench.client import RequestResult
from minivllm.bench.metrics import BUCKETS, summarize
from minivllm.bench.traces import build_trace
from minivllm.sim.calibrate import calibrate
from minivllm.sim.profile import ProfileCostModel
from minivllm.sim.simulator import Simulator

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT.parent / "shared" / "traces" / "azure-llm-2023-code.csv"


def replay_engine(core, trace, prompts) -> tuple[list[RequestResult], float]:
    """Real time: add each request at its send time, step while there is work."""
    from minivllm.engine.messages import EngineCoreRequest
    from minivllm.sampling_params import SamplingParams

    results = [RequestResult(i, e.user, e.priority, e.prompt_tokens, e.output_tokens,
                             e.send_time, start=e.send_time) for i, e in enumerate(trace.entries)]
    last: dict[int, float] = {}
    pending = deque(enumerate(trace.entries))
    t0 = time.perf_counter()
    while pending or core.has_unfinished_requests():
        now = time.perf_counter() - t0
        while pending and pending[0][1].send_time <= now:
            i, e = pending.popleft()
            params = SamplingParams(max_tokens=e.output_tokens, ignore_eos=True, temperature=0)
            core.add_request(EngineCoreRequest(str(i), prompts[i], params, time.time()))
        if not core.has_unfinished_requests():
            time.sleep(max(0.0, pending[0][1].send_time - (time.perf_counter() - t0)))
            continue
        outputs = core.step()
        t = time.perf_counter() - t0
        for out in outputs.outputs:
            r = results[int(out.request_id)]
            if out.new_token_ids:
                if r.ttft is None:
                    r.ttft = t - r.send_time
                else:
                    r.itl.append(t - last[r.index])
                last[r.index] = t
                r.output_tokens += len(out.new_token_ids)
            if out.finish_reason is not None:
                r.e2e, r.success = t - r.send_time, out.finish_reason == "length"
    return results, time.perf_counter() - t0


def bucket_rows(real: dict, sim: dict) -> list[dict]:
    rows = []
    for b in BUCKETS:
        x, y = real["buckets"][b], sim["buckets"][b]
        row = {"bucket": b, "requests": x["requests"]}
        for key in ("ttft_ms", "tpot_ms"):
            for stat in ("mean", "p90"):
                e, s = x[key][stat], y[key][stat]
                row[f"{key}_{stat}"] = (e, s, None if not e or s is None else (s - e) / e)
        rows.append(row)
    return rows


def fmt(cell, scale=1.0) -> str:
    e, s, err = cell
    if e is None or s is None:
        return "- | - | -"
    return f"{e / scale:.3g} | {s / scale:.3g} | {err:+.0%}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=str(ROOT.parent / "shared" / "models" / "stories260K"))
    p.add_argument("--profile", default=None, help="a profile JSON (default: calibrate now)")
    p.add_argument("--workloads", nargs="+", default=["seed-low", "seed-medium", "seed-high",
                                                      "azure"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--azure-start", type=int, default=0)
    p.add_argument("--azure-rows", type=int, default=300)
    p.add_argument("--azure-time-scale", type=float, default=0.2)
    p.add_argument("--output", default=None, help="write the results as JSON here")
    args = p.parse_args()

    from minivllm.config import EngineConfig
    from minivllm.engine.core import EngineCore

    profile = (ProfileCostModel.load(args.profile) if args.profile
               else calibrate(args.model))
    print(profile.report())
    core = EngineCore(EngineConfig(model=args.model, seed=0))
    config = core.scheduler.config
    doc = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
           "model": args.model, "profile": profile.describe(), "workloads": {}}
    for name in args.workloads:
        spec = f"azure:{AZURE}" if name == "azure" else name
        trace = build_trace(spec, seed=args.seed, max_model_len=config.max_model_len,
                            start=args.azure_start, time_scale=args.azure_time_scale,
                            num_prompts=args.azure_rows if name == "azure" else None)
        rng = np.random.default_rng(args.seed)
        prompts = [rng.integers(3, core.vocab_size, e.prompt_tokens).tolist()
                   for e in trace.entries]
        load = os.getloadavg()
        real_results, real_s = replay_engine(core, trace, prompts)
        real = summarize(real_results, real_s, trace.buckets)
        sim = Simulator(config, core.config.scheduling_policy, profile).run(trace, prompts)
        simulated = summarize(sim.results, sim.stats.simulated_wall_time_s, trace.buckets)
        rows = bucket_rows(real, simulated)
        doc["workloads"][name] = {"requests": len(trace.entries), "engine_s": real_s,
                                  "simulated_s": sim.stats.simulated_wall_time_s,
                                  "load_before": load, "rows": rows}
        print(f"\n## {trace.workload}: {len(trace.entries)} requests, length scale "
              f"{trace.length_scale:.4g}; engine {real_s:.1f} s, simulated "
              f"{sim.stats.simulated_wall_time_s:.1f} s; load average before {load[0]:.2f}\n")
        cols = " | ".join(f"{m} engine | sim | err" for m in (
            "TTFT mean (s)", "TTFT p90 (s)", "TPOT mean (ms)", "TPOT p90 (ms)"))
        print(f"| bucket | n | {cols} |\n" + "|---" * 14 + "|")
        for r in rows:
            print(f"| {r['bucket']} | {r['requests']} | {fmt(r['ttft_ms_mean'], 1000)} | "
                  f"{fmt(r['ttft_ms_p90'], 1000)} | {fmt(r['tpot_ms_mean'])} | "
                  f"{fmt(r['tpot_ms_p90'])} |")
    print(f"\n{doc['date']}, {doc['machine']}, load average now {os.getloadavg()[0]:.2f}")
    if args.output:
        Path(args.output).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
