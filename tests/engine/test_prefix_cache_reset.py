"""Clearing the prefix cache without a restart (LLM.reset_prefix_cache; the server's POST
/reset_prefix_cache is tests/entrypoints/test_kv_disk_tier_server.py's): a prompt served
before is a miss after it; with reset_external the disk tier's files go too, and the next
run recomputes; a running request keeps its blocks and its output; a bad argument to the
core's utility call is answered, not fatal."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from minivllm import SamplingParams
from minivllm.engine.core_proc import run_busy_loop
from minivllm.engine.messages import (
    EngineCoreShutdown,
    EngineCoreUtility,
    UtilityResult,
    make_core_request,
)
from tests.engine.test_kv_disk_tier import HIT_TOKENS, PROMPT, engine, evict_prompt, files, generate


@pytest.fixture(scope="module")
def cold(tiny_llama) -> list[int]:
    """PROMPT's greedy output from a fresh engine."""
    return generate(engine(tiny_llama), PROMPT)


def test_after_a_reset_a_repeated_prompt_is_a_miss(tiny_llama, cold):
    llm = engine(tiny_llama)
    generate(llm, PROMPT)
    assert llm.reset_prefix_cache() is True
    before = llm.stats()
    assert generate(llm, PROMPT) == cold
    after = llm.stats()
    assert after.prefix_cache_hits == before.prefix_cache_hits
    assert after.num_computed_tokens - before.num_computed_tokens == len(PROMPT) + 5
    assert generate(llm, PROMPT) == cold  # cached again from then on
    assert llm.stats().prefix_cache_hits - after.prefix_cache_hits == HIT_TOKENS


def test_reset_external_deletes_the_disk_tier(tiny_llama, tmp_path, cold):
    llm = engine(tiny_llama, tmp_path)
    evict_prompt(llm)
    generate(llm, PROMPT)  # in memory again, and still on disk
    held = llm.stats()
    assert held.kv_disk_blocks == len(files(tmp_path)) > 0
    assert held.kv_disk_used_bytes == sum(f.stat().st_size for f in files(tmp_path))
    assert held.kv_disk_capacity_bytes > held.kv_disk_used_bytes

    llm.reset_prefix_cache()  # memory only: the tier serves the prefix again
    before = llm.stats()
    assert generate(llm, PROMPT) == cold
    after = llm.stats()
    assert after.kv_disk_hits - before.kv_disk_hits == HIT_TOKENS
    assert after.prefix_cache_hits - before.prefix_cache_hits == HIT_TOKENS

    llm.reset_prefix_cache(reset_external=True)
    assert files(tmp_path) == []
    cleared = llm.stats()
    assert (cleared.kv_disk_blocks, cleared.kv_disk_used_bytes) == (0, 0)
    assert generate(llm, PROMPT) == cold
    last = llm.stats()
    assert last.prefix_cache_hits == cleared.prefix_cache_hits
    assert last.kv_disk_hits == cleared.kv_disk_hits
    assert last.num_computed_tokens - cleared.num_computed_tokens == len(PROMPT) + 5


def test_a_running_request_keeps_its_blocks_and_its_output(tiny_llama, tmp_path, cold):
    llm = engine(tiny_llama, tmp_path)
    evict_prompt(llm)
    core_engine, params = llm.llm_engine, SamplingParams(temperature=0, max_tokens=6)
    core_engine.add_request("running", make_core_request("running", PROMPT, params), params)
    core_engine.step()  # its prefill: loaded from the tier, the rest computed
    core_engine.step()
    request = core_engine.scheduler.requests["running"]
    kv = core_engine.scheduler.kv
    held = list(request.block_ids)
    llm.reset_prefix_cache(reset_external=True)
    assert all(kv.blocks[b].ref_cnt == 1 and b not in kv.free_queue for b in held)
    assert not kv.cached and files(tmp_path) == []
    out = None
    while core_engine.has_unfinished_requests():
        for output in core_engine.step():
            out = list(output.outputs[0].token_ids)
    assert out == cold


def test_a_bad_utility_argument_is_answered_and_the_core_lives_on():
    sent, inputs = [], [EngineCoreUtility(1, "reset_prefix_cache", {"bogus": True}),
                        EngineCoreUtility(2, "reset_prefix_cache", {"reset_external": True}),
                        EngineCoreShutdown()]
    core = SimpleNamespace(reset_prefix_cache=lambda reset_external=False: reset_external,
                           has_unfinished_requests=lambda: False, shutdown=lambda: None,
                           get_stats=lambda: None, take_trace=lambda now, force: None)
    assert run_busy_loop(core, lambda timeout: inputs.pop(0) if inputs else None,
                         sent.append) == 0
    results = [m for m in sent if isinstance(m, UtilityResult)]
    assert "bogus" in results[0].error and results[1] == UtilityResult(2, result=True)
