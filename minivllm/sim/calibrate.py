"""`minivllm sim calibrate --model DIR`: time the real engine's steps on this machine over a grid
of batch compositions and fit the profile cost model (sim/profile.py) to them.

Each grid point sends `num_seqs` requests of `prompt_len` random tokens (ignore_eos, a fixed
max_tokens), one arriving every other step, so the steps mix prefill chunks of many sizes and
contexts with decode batches that grow and shrink. Every EngineCore.step is timed whole
(scheduling, the forward, sampling, bookkeeping: what a simulated step stands for) and
described with the simulator's own step_batch. The first grid point runs twice and its first
run is dropped (warm-up: allocations, kernel caches).

The disk tier's rates (--kv-offloading-backend disk): the real DiskKVStore writes, then
stages and loads, a few of the engine's own blocks in a temporary folder (TMPDIR: put it on
the tier's disk). The reads come right after the writes, from the page cache where it
holds them: a disk's cold reads are slower.
"""

from __future__ import annotations

import itertools
import tempfile
import time

import numpy as np

from minivllm.core.step_batch import StepBatch, step_batch
from minivllm.sim.profile import ProfileCostModel, features, fit
from minivllm.sim.roofline import ModelShape
from minivllm.sim.step_kinds import relative_errors

FULL_GRID = {"prompt_len": (16, 64, 192, 448), "num_seqs": (1, 4, 16, 48), "output_len": 24}
QUICK_GRID = {"prompt_len": (8, 40), "num_seqs": (1, 6), "output_len": 6}
DISK_PROBE_BLOCKS = 16


def measure_disk(runner) -> tuple[float, float]:
    """The disk tier's read and write rates (bytes/s), with the runner's KV blocks."""
    from minivllm.model import kv_quant
    from minivllm.model.kv_disk import DiskKVStore

    keys = [i.to_bytes(16, "little") for i in range(min(DISK_PROBE_BLOCKS, runner.num_blocks))]
    with tempfile.TemporaryDirectory(prefix="minivllm-calibrate-") as folder:
        store = DiskKVStore(folder, 1 << 40, {"calibrate": True},
                            kv_quant.tensors((runner.k_cache, runner.v_cache)))
        try:
            t0 = time.perf_counter()
            store.write(list(enumerate(keys)))
            store.drain()  # the writer thread's files in place: what a write costs the disk
            t1 = time.perf_counter()
            for key in keys:
                store.stage(key)
            store.load([(key, block) for block, key in enumerate(keys)])
            t2 = time.perf_counter()
        finally:
            store.close()  # its threads stopped before the folder goes
    return store.bytes_read / (t2 - t1), store.bytes_written / (t1 - t0)


def _run_point(core, prompt_len: int, num_seqs: int, output_len: int, rng, tag: str,
               record: list) -> None:
    from minivllm.engine.messages import EngineCoreRequest
    from minivllm.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0)
    vocab = core.vocab_size
    pending = [rng.integers(3, vocab, prompt_len).tolist() for _ in range(num_seqs)]
    step = 0
    while pending or core.has_unfinished_requests():
        if pending and step % 2 == 0:
            core.add_request(EngineCoreRequest(f"{tag}-{len(pending)}", pending.pop(),
                                               params, time.time()))
        t0 = time.perf_counter()
        core.step()
        record.append(time.perf_counter() - t0)
        step += 1


def make_core(model: str, num_threads: int | None, max_num_batched_tokens: int | None,
              kv_cache_dtype: str):
    from minivllm.config import EngineConfig
    from minivllm.engine.core import EngineCore

    return EngineCore(EngineConfig(model=model, num_threads=num_threads, seed=0,
                                   max_num_batched_tokens=max_num_batched_tokens,
                                   kv_cache_dtype=kv_cache_dtype))


def timed_steps(core, grid: dict) -> list[tuple[StepBatch, float]]:
    """The engine's steps over `grid` (after a warm-up run of its first point), each
    described as the simulator describes it, with its measured seconds."""
    sched = core.scheduler
    batches: list[StepBatch | None] = []
    schedule = sched.schedule

    def described_schedule():
        out = schedule()
        batches.append(step_batch(out, sched.requests, sched.config.block_size)
                       if out.num_scheduled_tokens else None)
        return out

    sched.schedule = described_schedule
    rng = np.random.default_rng(0)
    limit = sched.config.max_model_len - grid["output_len"]
    points = [(min(p, limit), n) for p, n in itertools.product(grid["prompt_len"],
                                                                 grid["num_seqs"])]
    seconds: list[float] = []
    _run_point(core, *points[0], grid["output_len"], rng, "warmup", seconds)
    batches.clear()
    seconds.clear()
    for i, (prompt_len, num_seqs) in enumerate(points):
        _run_point(core, prompt_len, num_seqs, grid["output_len"], rng, f"p{i}", seconds)
    sched.schedule = schedule
    return [(b, s) for b, s in zip(batches, seconds, strict=True) if b is not None]


def engine_description(core, model: str, num_threads: int | None, kv_cache_dtype: str,
                       grid: dict) -> dict:
    """The engine the steps were measured on, which becomes the simulator's defaults, and
    the disk tier's rates on this machine."""
    sched = core.scheduler
    dtype = str(core.runner.dtype).removeprefix("torch.")
    shape = ModelShape.from_config(core.hf_config.to_dict(), model, dtype)
    disk_read, disk_write = measure_disk(core.runner)
    return {"model": model, "num_kv_blocks": sched.config.num_blocks,
            "block_size": sched.config.block_size, "max_model_len": sched.config.max_model_len,
            "max_num_batched_tokens": sched.config.max_num_batched_tokens,
            "kv_bytes_per_token": core.runner.block_bytes // sched.config.block_size,
            "kv_cache_dtype": kv_cache_dtype,
            "kv_shape": [shape.num_layers, shape.num_kv_heads, shape.head_dim,
                         shape.dtype_bytes],
            "disk_read_bandwidth": disk_read, "disk_write_bandwidth": disk_write,
            "dtype": dtype, "num_threads": num_threads, "grid": grid,
            "pads_rows": list(core.runner.row_padding.pads),
            "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def calibrate(model: str, *, quick: bool = False, num_threads: int | None = None,
              max_num_batched_tokens: int | None = None,
              kv_cache_dtype: str = "auto") -> ProfileCostModel:
    core = make_core(model, num_threads, max_num_batched_tokens, kv_cache_dtype)
    grid = QUICK_GRID if quick else FULL_GRID
    timed = timed_steps(core, grid)
    padding = core.runner.row_padding
    coefficients = fit([b for b, _ in timed], [s for _, s in timed], padding)
    predicted = np.asarray([np.dot(features(b, padding), [coefficients[k] for k in coefficients])
                            for b, _ in timed])
    actual = np.asarray([s for _, s in timed])
    rel = np.abs(predicted - actual) / actual
    engine = engine_description(core, model, num_threads, kv_cache_dtype, grid)
    fit_error = {"num_steps": len(timed), "mean": float(rel.mean()),
                 "p90": float(np.percentile(rel, 90)),
                 "by_kind": relative_errors([(b, s, float(p)) for (b, s), p
                                             in zip(timed, predicted, strict=True)])}
    return ProfileCostModel(coefficients, engine, fit_error, f"profile:{model}")
