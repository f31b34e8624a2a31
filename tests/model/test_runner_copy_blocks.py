"""ModelRunner.copy_blocks on a real runner's KV tensors: swap-outs first, then the
copy-on-write copies with every source read before any destination is written, then
swap-ins -- the order core/kv_cache.py relies on when it hands a block freed this step out
again in the same step."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from minivllm.config import EngineConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.model.runner import ModelRunner


@pytest.fixture(scope="module")
def runner(tiny_llama) -> ModelRunner:
    config = EngineConfig(model=str(tiny_llama), num_kv_blocks=8, swap_space=0.001)
    runner = ModelRunner(config, tiny_llama, AutoConfig.from_pretrained(tiny_llama), 64)
    assert runner.num_blocks == 8 and runner.num_swap_blocks >= 2
    return runner


def fill(runner: ModelRunner) -> None:
    """Device block b holds b + 1 (keys) and -(b + 1) (values); host block h holds 100 + h."""
    for cache, sign in ((runner.k_cache, 1), (runner.v_cache, -1)):
        for block in range(cache.shape[1]):
            cache[:, block] = sign * (block + 1)
    for cache, sign in ((runner.k_host, 1), (runner.v_host, -1)):
        for block in range(cache.shape[1]):
            cache[:, block] = sign * (100 + block)


def held(runner: ModelRunner, cache: str, block: int) -> float:
    k, v = getattr(runner, f"k_{cache}"), getattr(runner, f"v_{cache}")
    values = torch.unique(k[:, block])
    assert len(values) == 1 and torch.equal(v[:, block], -k[:, block])
    return values.item()


def test_swap_outs_then_copies_all_at_once_then_swap_ins(runner):
    fill(runner)
    out = SchedulerOutput(
        step=1,
        # Block 2 is swapped out, then handed out again as a copy's destination.
        swap_out=[(2, 0)],
        # A chain: 5 is written from 4 and read for 6; 6 must get 5's old contents.
        copies=[(3, 2), (4, 5), (5, 6)],
        # Block 4, a copy source, is handed out again to a swap-in.
        swap_in=[(1, 4)])
    runner.copy_blocks(out)
    assert held(runner, "host", 0) == 2 + 1  # read before the copy overwrote block 2
    assert held(runner, "cache", 2) == 3 + 1
    assert held(runner, "cache", 5) == 4 + 1  # read before the swap-in overwrote block 4
    assert held(runner, "cache", 6) == 5 + 1  # every source read before any write
    assert held(runner, "cache", 4) == 100 + 1
    for block in (0, 1, 3, 7):
        assert held(runner, "cache", block) == block + 1
    assert held(runner, "host", 1) == 100 + 1
