"""`minivllm sim calibrate --operators --model DIR`: time each operator the engine runs, with
the engine's own modules, kernels and threads, in this process, and write the operator cost
model's tables (sim/operators_model.py).

The model is loaded through EngineCore, as `sim calibrate` does; then, on a grid:
- the decoder layers' linears (q/k/v, o_proj, gate/up, down) and the LM head, at each row
  count of the grid (oneDNN buckets: the runner pads a step's rows to them);
- the paged attention entry point of every layer over the engine's KV cache, with metadata
  built as the runner builds it: one prefill chunk of n new tokens after c cached ones, and
  b decodes each reading c tokens (their blocks distinct while the cache has enough, so that
  a long decode batch reads memory, not a cached block);
The layers' operators are timed in sweeps over all layers, as a forward runs them (its
weights and KV streamed from memory, not one layer's left in the cache), per layer.
- the sampler (greedy rows, as calibrate's and the fidelity benchmark's requests) by rows;
- a swap copy of a few blocks to the host pool, per token slot.
Each is the median of a few passes after a warm-up pass, every pass timing each point of
its table once (interleaved_medians). Then the framework overhead: the
real engine runs a grid of batches (OVERHEAD_GRID), and what the tables do not explain of
each step is fitted as c_step + c_decode x decodes + c_prefill x prefill chunks + c_token x
prefill tokens (non-negative; the first two on the decode-only steps, then the other two).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from minivllm.core.step_batch import padded_rows
from minivllm.sim.calibrate import (
    QUICK_GRID,
    engine_description,
    make_core,
    timed_steps,
)
from minivllm.sim.operators_model import LINEARS, OVERHEAD_TERMS, OperatorCostModel
from minivllm.sim.operators_model import machine_identity as cpu_identity
from minivllm.sim.profile import nonnegative_fit
from minivllm.sim.step_kinds import relative_errors

FULL = {"contexts": (0, 64, 256, 1024, 4096), "query_tokens": (2, 8, 32, 128, 512, 2048),
        "decode_batch": (1, 2, 4, 8, 16, 32, 64, 128, 256), "repeats": 7}
# The real steps the overhead is fitted on (QUICK_GRID's with --quick): decode batches and
# prefills of several sizes, so that no term stands in for another.
OVERHEAD_GRID = {"prompt_len": (8, 40, 128), "num_seqs": (1, 6, 16), "output_len": 8}
QUICK = {"contexts": (0, 64, 256), "query_tokens": (2, 16, 64),
         "decode_batch": (1, 4, 16), "repeats": 3, "max_rows": 64}
SWAP_PROBE_BLOCKS = 8


def interleaved_medians(timers: list, repeats: int) -> list:
    """Each timer's median over `repeats` passes, after a warm-up pass (allocations, oneDNN
    primitives, caches), every pass calling each timer once in turn. A timer returns
    seconds, or a dict of them (medians per key). Not `repeats` calls in a row: a host's
    memory speed can move for seconds at a time (the Zen 5, 2026-11-30: SmolLM2's batch-1
    decode at 10.5 ms for 5-60 s, then at 13.5-15 ms, while a torch matrix-vector product
    held its bandwidth), and consecutive calls would price each point in whichever spell it
    fell; spread over the whole calibration, a point's median is the host's usual speed."""
    samples: list[list] = [[] for _ in timers]
    for done in range(repeats + 1):
        for timer, taken in zip(timers, samples, strict=True):
            value = timer()
            if done:
                taken.append(value)
    if not timers or not isinstance(samples[0][0], dict):
        return [statistics.median(taken) for taken in samples]
    return [{key: statistics.median(s[key] for s in taken) for key in taken[0]}
            for taken in samples]


def timed(fn):
    """A timer of fn's seconds."""
    def timer() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return timer


# Up to here the rows grid holds each multiple of 64 and the count after it; beyond, the
# powers of two (a 64-row step is a few percent of a call there).
FINE_ROWS = 512


def rows_grid(max_rows: int) -> list[int]:
    """The row counts the linears and the LM head are timed at, ending at the padded
    max_rows: 1, 2, 4, 8, 16, then each multiple of 16 up to 64 and of 64 up to FINE_ROWS,
    each with the count after it, then powers of two. Kernels work in blocks of rows —
    oneDNN's padded buckets, the 4-bit kernels' row tiles — so a call's time steps up just
    past a block and stays flat across it: Qwen2.5-Coder's Q4_K_M linears take 100 ms a
    forward at 128 rows and 145 at 129-144 (a Zen 5, 2 threads), where powers of two alone
    interpolated 112 for 144 rows and priced serving's mixed steps 13-14% fast."""
    top = padded_rows(max_rows)
    points = {1, 2, 4, 8, 16}
    for block, end in ((16, 64), (64, FINE_ROWS)):
        for m in range(block, end + 1, block):
            points |= {m, m + 1}
    p = FINE_ROWS * 2
    while p < top:
        points.add(p)
        p *= 2
    return [*sorted(r for r in points if r < top), top]


def _linears(layer) -> dict:
    """The four timed calls of a layer, as its forward makes them; "gate_up" with the
    activation after it (fused into the GGUF kernel's epilogue where it runs there)."""
    return {"qkv": layer.self_attn.qkv, "o_proj": layer.o_proj,
            "gate_up": layer.mlp.activation, "down": layer.mlp.down}


def linear_sweeps(layers, hidden: int, grid: list[int], dtype) -> tuple[list, dict]:
    """Per row count of `grid`, a timer of one sweep over every layer's linears in forward
    order (each call timed; seconds per linear, summed over the layers): a forward streams
    every layer's weights, where calling one linear again would find its weights in the
    cache (for a decode, several times faster). And each linear's k, n and weight type: K
    from the layer's shape (a packed or quantized weight does not tell it), N from what the
    linear returns."""
    import torch

    attn, mlp = layers[0].self_attn, layers[0].mlp
    first = _linears(layers[0])
    weights = {"qkv": attn.qkv, "o_proj": layers[0].o_proj, "gate_up": mlp.gate_up,
               "down": mlp.down}
    widths = {"qkv": hidden, "o_proj": attn.num_heads * attn.head_dim, "gate_up": hidden}
    outs = {name: first[name](torch.zeros(1, widths[name], dtype=dtype)).shape[-1]
            for name in ("qkv", "o_proj", "gate_up")}
    widths["down"] = outs["gate_up"]  # down reads act(gate) * up
    outs["gate_up"] *= 2
    outs["down"] = first["down"](torch.zeros(1, widths["down"], dtype=dtype)).shape[-1]
    modules = [_linears(layer) for layer in layers]

    def sweep(rows: int):
        def timer() -> dict[str, float]:
            inputs = {name: torch.randn(rows, widths[name], dtype=dtype) for name in LINEARS}
            totals = dict.fromkeys(LINEARS, 0.0)
            for layer in modules:
                for name in LINEARS:
                    t0 = time.perf_counter()
                    layer[name](inputs[name])
                    totals[name] += time.perf_counter() - t0
            return totals
        return timer

    described = {name: {"k": widths[name], "n": outs[name],
                        "weight": type(weights[name]).__name__} for name in LINEARS}
    return [sweep(rows) for rows in grid], described


def time_linears(layers, hidden: int, grid: list[int], dtype, repeats: int) -> dict:
    """Each linear's k, n, weight type and seconds a layer at each row count of `grid`."""
    timers, described = linear_sweeps(layers, hidden, grid, dtype)
    medians = interleaved_medians(timers, repeats)
    return {name: {**described[name], "seconds": [m[name] / len(layers) for m in medians]}
            for name in LINEARS}


# How long decode_probe sweeps; calibration probes four times (at its start, between its
# parts, at its end) and keeps the median: the host's speed then, for sim_fidelity's
# --host-check to compare a probe taken before a replay with.
PROBE_SECONDS = 1.0


def decode_probe(core, seconds: float = PROBE_SECONDS) -> float:
    """Seconds a layer of the four linears at one row (a batch-1 decode's), swept over the
    layers as the calibration swept its first point, for `seconds`: the median of the
    second half's sweeps (after an idle spell the first sweeps ran 15-50% slow on the Zen 5).
    Against the calibration's (tables["decode_probe_seconds"]), how fast the host runs now
    beside how fast it ran then."""
    import torch

    runner = core.runner
    times = []
    with torch.inference_mode():
        [sweep], _ = linear_sweeps(runner.model.layers, runner.model.norm.weight.shape[0], [1],
                                   runner.dtype)
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            times.append((time.perf_counter() - start, sum(sweep().values())))
    late = [t for at, t in times if at >= seconds / 2] or [times[-1][1]]
    return statistics.median(late) / len(runner.model.layers)


def _metadata(runner, query_tokens: list[int], contexts: list[int], num_decodes: int):
    """AttentionMetadata of requests with these new tokens after these cached ones, each on
    its own blocks (wrapping around the cache where it has too few)."""
    import torch

    from minivllm.model.attention import AttentionMetadata

    bs = runner.block_size
    seq_lens = [q + c for q, c in zip(query_tokens, contexts, strict=True)]
    width = max(-(-s // bs) for s in seq_lens)
    table = torch.arange(len(seq_lens) * width).view(len(seq_lens), width) % runner.num_blocks
    loc = torch.tensor([0, *np.cumsum(query_tokens).tolist()])
    slots = torch.cat([table[i, (c + torch.arange(q)) // bs] * bs + (c + torch.arange(q)) % bs
                       for i, (q, c) in enumerate(zip(query_tokens, contexts, strict=True))])
    return AttentionMetadata(slot_mapping=slots, block_table=table,
                             seq_lens=torch.tensor(seq_lens), query_start_loc=loc,
                             num_decodes=num_decodes, num_tokens=int(loc[-1]), block_size=bs,
                             use_kernel=runner.use_kernels)


def time_attention(runner, layers, settings: dict, config) -> tuple[dict, dict]:
    """(prefill table by query tokens x context, decode table by batch x context), at the
    points the scheduler's limits reach: seconds a layer, each timing a sweep over every
    layer's attention (its own KV cache, window and softcap), as a forward runs them."""
    import torch

    from minivllm.model.attention import paged_attention

    attns = [layer.self_attn for layer in layers]
    caches = [(runner.k_cache[i], runner.v_cache[i]) for i in range(len(layers))]

    def sweep(q, meta):
        for attn, (k_cache, v_cache) in zip(attns, caches, strict=True):
            paged_attention(q, k_cache, v_cache, meta, attn.scale, attn.window, attn.softcap)

    def timer(query_tokens: list[int], contexts: list[int], num_decodes: int):
        q = torch.randn(sum(query_tokens), attns[0].num_heads, attns[0].head_dim,
                        dtype=runner.dtype)
        meta = _metadata(runner, query_tokens, contexts, num_decodes)
        return timed(lambda: sweep(q, meta))

    max_len = config.max_model_len
    contexts = [c for c in settings["contexts"] if c < max_len]
    query_tokens = [n for n in settings["query_tokens"]
                    if n <= min(max_len, config.max_num_batched_tokens)]
    batches = [b for b in settings["decode_batch"] if b <= config.max_num_seqs]
    decode_contexts = [max(c, 1) for c in contexts]
    points = ([([n], [c], 0) for n in query_tokens for c in contexts]
              + [([1] * b, [c - 1] * b, b) for b in batches for c in decode_contexts])
    medians = iter(m / len(layers) for m in
                   interleaved_medians([timer(*p) for p in points], settings["repeats"]))
    prefill = [[next(medians) for _ in contexts] for _ in query_tokens]
    decode = [[next(medians) for _ in decode_contexts] for _ in batches]
    return ({"query_tokens": query_tokens, "context": contexts, "seconds": prefill},
            {"batch": batches, "context": decode_contexts, "seconds": decode})


def time_lm_head(model, hidden: int, grid: list[int], dtype, repeats: int) -> dict:
    import torch

    seconds = interleaved_medians(
        [timed(lambda h=torch.randn(r, hidden, dtype=dtype): model.compute_logits(h))
         for r in grid], repeats)
    return {"k": hidden, "seconds": seconds}


def time_sampler(sampler, grid: list[int], repeats: int) -> dict:
    """Greedy rows, each a request the sampler holds for the timing."""
    import torch

    from minivllm.sampling_params import SamplingParams

    ids = [f"calibrate-{i}" for i in range(max(grid))]
    for req_id in ids:
        sampler.add_request(req_id, SamplingParams(temperature=0), [1], [], [], 0)
    seconds = interleaved_medians(
        [timed(lambda r=r, x=torch.randn(r, sampler.vocab_size): sampler.sample(x, ids[:r]))
         for r in grid], repeats)
    for req_id in ids:
        sampler.remove_request(req_id)
    return {"rows": grid, "seconds": seconds}


def time_swap(runner, repeats: int) -> float:
    """Seconds per token slot of a device-to-host block copy (0: no host pool)."""
    n = min(SWAP_PROBE_BLOCKS, runner.num_swap_blocks, runner.num_blocks)
    if not n:
        return 0.0
    mapping = [(i, i) for i in range(n)]
    device, host = (runner.k_cache, runner.v_cache), (runner.k_host, runner.v_host)
    [seconds] = interleaved_medians([timed(lambda: runner._copy(mapping, device, host))],
                                    repeats)
    return seconds / (n * runner.block_size)


def fit_overhead(model: OperatorCostModel, steps: list) -> dict[str, float]:
    """OVERHEAD_TERMS' seconds (>= 0) fitted to each step's measured - operators' seconds
    (profile.nonnegative_fit: relative error, a negative term dropped), in two stages: the
    decode-only steps fix the per-step and per-decode terms, then the steps with a prefill
    fit the per-chunk and per-token terms on what those leave. Fitted all at once, what the
    tables under-price in a prefill step can go into the per-step term every decode pays."""
    x = np.asarray([[1.0, b.num_decode_seqs, b.num_prefill_seqs, b.num_prefill_tokens]
                    for b, _ in steps])
    y = np.asarray([s for _, s in steps])
    residual = y - np.asarray([model.operators_time(b) for b, _ in steps])
    decode_only = x[:, 2] == 0
    if decode_only.all() or not decode_only.any():
        return nonnegative_fit(x, residual, y, OVERHEAD_TERMS)
    per_step = nonnegative_fit(x[decode_only, :2], residual[decode_only], y[decode_only],
                               OVERHEAD_TERMS[:2])
    prefill = ~decode_only
    left = residual[prefill] - x[prefill, :2] @ np.asarray(list(per_step.values()))
    return {**per_step, **nonnegative_fit(x[prefill, 2:], left, y[prefill],
                                          OVERHEAD_TERMS[2:])}


def calibrate_operators(model: str, *, quick: bool = False, num_threads: int | None = None,
                        max_num_batched_tokens: int | None = None,
                        kv_cache_dtype: str = "auto", core=None) -> OperatorCostModel:
    """The tables of `model` on this machine, timed on `core` (an idle EngineCore of that
    model: the engine a fidelity run replays on, its weights where they are) or on a core of
    their own."""
    import torch

    if core is None:
        core = make_core(model, num_threads, max_num_batched_tokens, kv_cache_dtype)
    runner, config = core.runner, core.scheduler.config
    layers = runner.model.layers
    if not all(hasattr(layer.mlp, "gate_up") for layer in layers):
        raise ValueError(f"{model}: a mixture-of-experts MLP; the operator cost model times "
                         "dense layers (use the profile cost model: sim calibrate without "
                         "--operators)")
    settings = QUICK if quick else FULL
    grid = rows_grid(min(config.max_num_batched_tokens, settings.get("max_rows", 1 << 30)))
    repeats, dtype = settings["repeats"], runner.dtype
    probe_s = PROBE_SECONDS / 4 if quick else PROBE_SECONDS
    probes = [decode_probe(core, probe_s)]
    with torch.inference_mode():
        prefill, decode = time_attention(runner, layers, settings, config)
        probes.append(decode_probe(core, probe_s))
        hidden = runner.model.norm.weight.shape[0]
        linears = time_linears(layers, hidden, grid, dtype, repeats)
        probes.append(decode_probe(core, probe_s))
        tables = {"rows": grid, "linears": linears,
                  "lm_head": time_lm_head(runner.model, hidden, grid, dtype, repeats),
                  "sampler": time_sampler(runner.sampler, grid, repeats),
                  "prefill_attention": prefill, "decode_attention": decode,
                  "swap_seconds_per_token": time_swap(runner, repeats)}
    probes.append(decode_probe(core, probe_s))
    tables["decode_probe_seconds"] = statistics.median(probes)
    machine = {**cpu_identity(), "num_threads": torch.get_num_threads(),
               "dtype": str(dtype).removeprefix("torch."),
               "quantization": core.config.model_config.quantization,
               "kv_cache_dtype": kv_cache_dtype}
    engine = {**engine_description(core, model, num_threads, kv_cache_dtype, QUICK_GRID),
              "num_layers": len(runner.model.layers)}
    cost = OperatorCostModel(tables, dict.fromkeys(OVERHEAD_TERMS, 0.0), machine, engine,
                             source=f"operators:{model}")
    steps = timed_steps(core, QUICK_GRID if quick else OVERHEAD_GRID)
    cost.overhead = fit_overhead(cost, steps)
    cost.fit_error = relative_errors([(b, s, cost.step_time(b)) for b, s in steps])
    return cost
