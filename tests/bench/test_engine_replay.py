"""The engine replay the simulator is checked against (bench/engine_replay.py)."""

from dataclasses import replace

import numpy as np

from minivllm.bench.engine_replay import replay_engine
from minivllm.bench.traces import build_trace


def test_each_replay_starts_from_an_empty_prefix_cache(tiny_llama):
    """Replaying the same prompts again on one core computes every prompt token again, as a
    fresh simulation would: the first replay's cached blocks are not hits."""
    from minivllm.config import EngineConfig
    from minivllm.engine.core import EngineCore

    core = EngineCore(EngineConfig(model=str(tiny_llama), seed=0, max_model_len=512))
    trace = build_trace("seed-medium", seed=0, max_model_len=512, num_prompts=4)
    trace = replace(trace, entries=[replace(e, send_time=0.0) for e in trace.entries])
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, core.vocab_size, e.prompt_tokens).tolist() for e in trace.entries]
    computed = []
    for _ in range(2):
        results, _, steps = replay_engine(core, trace, prompts)
        assert all(r.success for r in results)
        computed.append(sum(b.num_prefill_tokens + b.num_decode_seqs for b, _ in steps))
    assert sum(e.prompt_tokens for e in trace.entries) >= 32  # whole blocks to hit
    assert computed[1] == computed[0]
