"""A trace replayed in real time through the real EngineCore (the scheduler and the model
runner in this process, no HTTP server in front): what the simulator is checked against
(benchmarks/sim_fidelity.py, benchmarks/sim_plan_check.py)."""

from __future__ import annotations

import os
import time
from collections import deque

from minivllm.bench.client import RequestResult
from minivllm.bench.timing import timed
from minivllm.core.step_batch import step_batch


def replay_engine(core, trace, prompts) -> tuple[list[RequestResult], float, list]:
    """Real time: add each request at its send time, step while there is work, from an
    empty prefix cache as each simulation starts (a replay before it on this core, of these
    prompts or of a trace whose prompts begin alike, would otherwise be served from the
    cache). Also returns each step's (StepBatch, seconds)."""
    from minivllm.engine.messages import EngineCoreRequest
    from minivllm.sampling_params import SamplingParams

    results = [RequestResult(i, e.user, e.priority, e.prompt_tokens, e.output_tokens,
                             e.send_time, start=e.send_time) for i, e in enumerate(trace.entries)]
    last: dict[int, float] = {}
    steps: list = []
    sched, batch = core.scheduler, [None]
    schedule = sched.schedule

    def described_schedule():  # as calibrate describes its steps
        out = schedule()
        batch[0] = (step_batch(out, sched.requests, sched.config.block_size)
                    if out.num_scheduled_tokens else None)
        return out

    core.reset_prefix_cache()
    sched.schedule = described_schedule
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
        outputs, seconds = timed(core.step)
        t = time.perf_counter() - t0
        if batch[0] is not None:
            steps.append((batch[0], seconds))
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
    sched.schedule = schedule
    return results, time.perf_counter() - t0, steps


def pin_threads(threads: int) -> str:
    """This process on its first `threads` cores, with that many compute threads."""
    import torch

    cores = sorted(os.sched_getaffinity(0))[:threads]
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(threads)
    return f"{threads} thread(s) pinned to core(s) {','.join(map(str, cores))}"
