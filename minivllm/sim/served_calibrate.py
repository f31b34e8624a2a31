"""`minivllm sim calibrate --served`: what the server adds to the engine core's time on
this machine (sim/served_overhead.py), measured from served runs' own timings.

After the profile is fitted to the core's steps, `minivllm serve MODEL` is started with the
same threads and sent, through `minivllm bench serve`, two decode-bound workloads of fresh
prompts: one request at a time, then `--served-batch` at once. The first run's
server-reported timings give the per-request terms (frontend_in; frontend_out plus the HTTP
transfer, medians over its requests). Each run is simulated on the profile alone, the same
workload and seed; the served and the simulated TPOT medians, at one sampled sequence a
step and at the batch's, give the per-step terms (served_overhead.fit_step_overhead).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from minivllm.sim.served_check import run_json, served_and_simulated
from minivllm.sim.served_overhead import ServedOverhead, fit_step_overhead

SERVED_SEED = 7000  # the calibration's prompts: none of a plan's or a check's seeds
PROMPT_LEN, OUTPUT_LEN = 64, 48


def _bench_flags(concurrency: int, prompts: int, seed: int) -> list[str]:
    return ["--workload", "random", "--input-len", str(PROMPT_LEN), "--output-len",
            str(OUTPUT_LEN), "--num-prompts", str(prompts), "--max-concurrency",
            str(concurrency), "--seed", str(seed), "--ignore-eos", "--disable-tqdm"]


def _median_part(doc: dict, *parts: str) -> float:
    """The median over the run's requests of the sum of their timing parts (seconds);
    'http': the client's TTFT minus the server's."""
    values = []
    for row in doc["requests"]:
        timing = row.get("server_timing")
        if not timing:
            continue
        total = 0.0
        for part in parts:
            total += (row["ttft"] - timing["server_ttft_s"] if part == "http"
                      else timing[f"{part}_s"])
        values.append(total)
    if not values:
        raise RuntimeError("the server reported no timing for its requests")
    return statistics.median(values)


def calibrate_served(model: str, profile_path: str, num_threads: int | None,
                     batch: int = 16) -> ServedOverhead:
    from minivllm.bench.server_process import (
        free_port,
        server_command,
        start_server,
        stop_server,
    )

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    flags = ["--num-threads", str(num_threads)] if num_threads else []
    with tempfile.TemporaryDirectory(prefix="minivllm-served-") as scratch:
        scratch = Path(scratch)
        proc, _ = start_server(server_command(model, port, "fcfs", flags),
                               scratch / "server.log", url)
        try:  # a warm-up, then one request at a time, then a batch at once
            run_json(["bench", "serve", "--base-url", url,
                       *_bench_flags(2, 4, SERVED_SEED)], scratch / "warmup")
            cost_model = f"profile:{profile_path}"
            lone = served_and_simulated(url, cost_model, _bench_flags(1, 8, SERVED_SEED + 1))
            many = served_and_simulated(url, cost_model,
                                        _bench_flags(batch, batch, SERVED_SEED + 2))
        finally:
            stop_server(proc)
    tpot = [tuple(doc["summary"]["tpot_ms"]["median"] / 1000 for doc in pair)
            for pair in (lone, many)]
    step_scale, token_s = fit_step_overhead(tpot[0], tpot[1], batch)
    served = lone[0]
    return ServedOverhead(
        request_in_s=_median_part(served, "frontend_in"),
        first_token_out_s=_median_part(served, "frontend_out", "http"),
        step_scale=step_scale, token_s=token_s,
        measured=(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: minivllm serve "
                  f"{model}, random {PROMPT_LEN}/{OUTPUT_LEN}; TPOT served / simulated: "
                  f"{tpot[0][0] * 1e3:.1f} / {tpot[0][1] * 1e3:.1f} ms one at a time, "
                  f"{tpot[1][0] * 1e3:.1f} / {tpot[1][1] * 1e3:.1f} ms {batch} at once"))


def add_served(profile_path: str, served: ServedOverhead) -> None:
    """The profile's JSON with the served terms added (`sim plan` then prices them)."""
    path = Path(profile_path)
    doc = json.loads(path.read_text())
    doc["served"] = served.as_dict()
    path.write_text(json.dumps(doc, indent=1))
