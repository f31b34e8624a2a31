"""The prefix cache's disk tier (--kv-offloading-backend disk) end to end on the tiny llama:
blocks evicted from memory are written, loaded back instead of recomputed (greedy output as
a cold engine's), found again by a restarted engine, refused when damaged or another
model's / dtype's / salt's, and bounded by --kv-offloading-size (LRU). A waiting request's
blocks are read by the prefetcher; a stopping engine waits for the writer."""

from __future__ import annotations

import gc
import itertools
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from minivllm import LLM, SamplingParams
from minivllm.engine.core_proc import run_busy_loop
from minivllm.engine.messages import EngineCoreShutdown, make_core_request
from minivllm.engine.stat_loggers import PrometheusStatLogger
from minivllm.engine.stats import IterationStats
from minivllm.lora.request import LoRARequest
from minivllm.model import kv_disk
from tests.lora_utils import make_adapter
from tests.model_factory import save_tiny_model

BLOCK = 4
PROMPT = list(range(5, 29))  # 24 tokens: 5 full blocks a hit may serve (one token is left)
FILLER = list(range(40, 80))  # 40 more: with max_tokens, every block of the pool
HIT_TOKENS = 5 * BLOCK
_ids = itertools.count()


def engine(model, path=None, **kwargs) -> LLM:
    disk = {"kv_offloading_backend": "disk", "kv_offloading_path": str(path)} if path else {}
    return LLM(str(model), num_kv_blocks=12, block_size=BLOCK, **disk, **kwargs)


def submit(llm: LLM, tokens: list[int], salt: str | None = None,
           lora: LoRARequest | None = None) -> None:
    """Add a greedy request for one prompt, with a cache_salt (the offline LLM takes none)."""
    params = SamplingParams(temperature=0, max_tokens=6)
    request_id = f"r{next(_ids)}"
    llm.llm_engine.add_request(request_id, make_core_request(
        request_id, tokens, params, cache_salt=salt, lora_request=lora), params)


def generate(llm: LLM, tokens: list[int], salt: str | None = None,
             lora: LoRARequest | None = None) -> list[int]:
    """Greedy tokens for one prompt (run alone: the engine steps until it is done)."""
    submit(llm, tokens, salt, lora)
    return finish(llm)


def finish(llm: LLM) -> list[int]:
    """Step the engine until its requests are done; the last one's tokens."""
    engine, out = llm.llm_engine, None
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                out = list(output.outputs[0].token_ids)
    return out


def evict_prompt(llm: LLM, salt: str | None = None, lora: LoRARequest | None = None) -> list[int]:
    """Run PROMPT, then a filler that takes every block: PROMPT's blocks go to disk."""
    out = generate(llm, PROMPT, salt, lora)
    generate(llm, FILLER)
    return out


def files(path: Path) -> list[Path]:
    return sorted(path.glob("*/*.kv"))


def settled(llm: LLM) -> LLM:
    """The engine once its disk tier's queued writes and prefetches are done."""
    llm.llm_engine.runner.disk.drain()
    return llm


@pytest.fixture(scope="module")
def cold(tiny_llama) -> list[int]:
    """PROMPT's greedy output from an engine without a disk tier."""
    return generate(engine(tiny_llama), PROMPT)


def test_evicted_prefix_is_loaded_not_recomputed(tiny_llama, tmp_path, cold):
    llm = engine(tiny_llama, tmp_path)
    assert evict_prompt(llm) == cold
    before = settled(llm).stats()
    assert before.kv_disk_bytes_written > 0 and files(tmp_path)
    assert generate(llm, PROMPT) == cold
    after = llm.stats()
    assert after.kv_disk_hits - before.kv_disk_hits == HIT_TOKENS
    assert after.prefix_cache_hits - before.prefix_cache_hits == HIT_TOKENS
    # the 4 prompt tokens past the hits and 5 decode steps: the rest came from disk
    assert after.num_computed_tokens - before.num_computed_tokens == 4 + 5
    assert after.kv_disk_bytes_read > 0
    prometheus = PrometheusStatLogger("tiny", 64)
    prometheus.record(after, IterationStats(timestamp=0.0))
    metrics = generate_latest(prometheus.registry).decode()
    assert f'vllm:external_prefix_cache_hits_total{{model_name="tiny"}} {HIT_TOKENS}.0' in metrics
    written = f'minivllm:kv_disk_bytes_written_total{{model_name="tiny"}} {after.kv_disk_bytes_written}'
    assert written in metrics


def test_without_the_tier_the_prefix_is_recomputed(tiny_llama, cold):
    """The control of the test above: the same requests recompute the evicted prefix."""
    llm = engine(tiny_llama)
    evict_prompt(llm)
    before = llm.stats()
    assert generate(llm, PROMPT) == cold
    assert llm.stats().num_computed_tokens - before.num_computed_tokens == len(PROMPT) + 5


def test_restart_serves_the_prefix_from_disk(tiny_llama, tmp_path, cold):
    evict_prompt(engine(tiny_llama, tmp_path))
    restarted = engine(tiny_llama, tmp_path)
    assert generate(restarted, PROMPT) == cold
    stats = restarted.stats()
    assert stats.kv_disk_hits == HIT_TOKENS and stats.num_computed_tokens == 4 + 5


def test_a_stopped_engine_writes_the_prefixes_still_in_memory(tiny_llama, tmp_path, cold):
    """Nothing evicted: PROMPT's blocks are in memory when the engine stops. Its core's
    shutdown (offline: when the engine is collected; a server: at EngineCoreShutdown)
    writes them, and a restart loads them."""
    llm = engine(tiny_llama, tmp_path)
    assert generate(llm, PROMPT) == cold
    assert not files(tmp_path)
    del llm
    gc.collect()
    assert files(tmp_path)
    restarted = engine(tiny_llama, tmp_path)
    assert generate(restarted, PROMPT) == cold
    assert restarted.stats().kv_disk_hits == HIT_TOKENS


def test_a_stopping_engine_waits_for_its_writer(tiny_llama, tmp_path, cold, monkeypatch):
    """The writer is slowed down: the files are all there once the engine's shutdown
    returns all the same."""
    encode = kv_disk.encode

    def slow(*args):
        threading.Event().wait(0.05)
        return encode(*args)

    monkeypatch.setattr(kv_disk, "encode", slow)
    llm = engine(tiny_llama, tmp_path)
    generate(llm, PROMPT)
    llm.llm_engine.core.shutdown()
    assert len(files(tmp_path)) == 7  # PROMPT's 24 tokens and 4 of its output: 7 blocks


def test_a_waiting_requests_blocks_are_read_by_the_prefetcher(tiny_llama, tmp_path, cold,
                                                              monkeypatch):
    """Added, not yet scheduled: the prefetcher reads and checks its disk blocks; the step
    that admits it loads them without reading them again."""
    evict_prompt(engine(tiny_llama, tmp_path))
    restarted = engine(tiny_llama, tmp_path)
    readers, decode = [], kv_disk.decode

    def counted(*args):
        readers.append(threading.current_thread().name)
        return decode(*args)

    monkeypatch.setattr(kv_disk, "decode", counted)
    submit(restarted, PROMPT)
    settled(restarted)
    assert readers == ["kv-disk-prefetch"] * (HIT_TOKENS // BLOCK)
    assert finish(restarted) == cold
    assert readers == ["kv-disk-prefetch"] * (HIT_TOKENS // BLOCK)
    assert restarted.stats().kv_disk_hits == HIT_TOKENS


def test_the_busy_loop_shuts_the_core_down_before_it_returns():
    calls = []
    core = SimpleNamespace(shutdown=lambda: calls.append("shutdown"),
                           has_unfinished_requests=lambda: False)
    assert run_busy_loop(core, lambda timeout: EngineCoreShutdown(), calls.append) == 0
    assert calls == ["shutdown"]


def test_a_quantized_cache_round_trips_with_its_scales(tiny_llama, tmp_path):
    quantized_cold = generate(engine(tiny_llama, kv_cache_dtype="int8"), PROMPT)
    evict_prompt(engine(tiny_llama, tmp_path, kv_cache_dtype="int8"))
    restarted = engine(tiny_llama, tmp_path, kv_cache_dtype="int8")
    assert generate(restarted, PROMPT) == quantized_cold
    assert restarted.stats().kv_disk_hits == HIT_TOKENS


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_files_are_refused_and_recomputed(tiny_llama, tmp_path, cold, damage):
    evict_prompt(engine(tiny_llama, tmp_path))
    damaged = files(tmp_path)
    for path in damaged:
        data = bytearray(path.read_bytes())
        if damage == "flip":
            data[-7] ^= 0x10  # in the payload: only the checksum can tell
        else:
            del data[-100:]
        path.write_bytes(bytes(data))
    restarted = engine(tiny_llama, tmp_path)
    assert generate(restarted, PROMPT) == cold
    stats = restarted.stats()
    # the first block's file fails its check: deleted, and the whole prefix recomputed
    assert stats.kv_disk_hits == 0 and stats.kv_disk_corrupt == 1
    assert stats.num_computed_tokens == len(PROMPT) + 5
    assert len(files(tmp_path)) == len(damaged) - 1


def test_salts_never_share_a_disk_block(tiny_llama, tmp_path):
    salted_cold = generate(engine(tiny_llama), PROMPT, salt="alice")
    assert evict_prompt(engine(tiny_llama, tmp_path), salt="alice") == salted_cold
    restarted = engine(tiny_llama, tmp_path)
    generate(restarted, PROMPT, salt="bob")
    generate(restarted, PROMPT)  # no salt
    assert restarted.stats().kv_disk_hits == 0
    assert generate(restarted, PROMPT, salt="alice") == salted_cold
    assert restarted.stats().kv_disk_hits == HIT_TOKENS


def test_adapters_never_share_a_disk_block(tiny_llama, tmp_path):
    a, b = (LoRARequest(name, i + 1, str(make_adapter(tiny_llama, tmp_path / name, seed=i)))
            for i, name in enumerate("ab"))
    lora_engine = lambda path=None: engine(tiny_llama, path, enable_lora=True,  # noqa: E731
                                           max_lora_rank=8)
    cold_a, cold_b = generate(lora_engine(), PROMPT, lora=a), generate(lora_engine(), PROMPT,
                                                                        lora=b)
    assert cold_a != cold_b  # else the test could not tell the adapters' K/V apart
    assert evict_prompt(lora_engine(tmp_path / "tier"), lora=a) == cold_a
    restarted = lora_engine(tmp_path / "tier")
    assert generate(restarted, PROMPT, lora=b) == cold_b
    assert restarted.stats().kv_disk_hits == 0
    assert generate(restarted, PROMPT, lora=a) == cold_a
    assert restarted.stats().kv_disk_hits == HIT_TOKENS


def test_another_model_or_kv_dtype_reads_nothing(tiny_llama, tmp_path, cold):
    evict_prompt(engine(tiny_llama, tmp_path))
    other_model = save_tiny_model("llama", tmp_path / "models" / "other", seed=1)
    for llm in (engine(other_model, tmp_path / "tier"),
                engine(tiny_llama, tmp_path, kv_cache_dtype="bfloat16")):
        generate(llm, PROMPT)
        assert llm.stats().kv_disk_hits == 0
    # the other model's files, moved into this model's folder, fail their header check
    shutil.rmtree(tmp_path / "tier")
    other = engine(other_model, tmp_path / "tier")
    evict_prompt(other)
    settled(other)  # still running: its writer may owe the prefix's head (written last)
    (ours,) = {path.parent for path in files(tmp_path) if "tier" not in path.parts}
    for path in files(tmp_path / "tier"):
        shutil.copy(path, ours / path.name)  # the same tokens: the same names
    restarted = engine(tiny_llama, tmp_path)
    assert generate(restarted, PROMPT) == cold
    assert restarted.stats().kv_disk_hits == 0 and restarted.stats().kv_disk_corrupt == 1


def test_size_bound_evicts_least_recently_written(tiny_llama, tmp_path, cold):
    evict_prompt(engine(tiny_llama, tmp_path / "sizing"))
    file_bytes = files(tmp_path / "sizing")[0].stat().st_size
    llm = engine(tiny_llama, tmp_path, kv_offloading_size=3.5 * file_bytes / (1 << 30))
    # PROMPT's 7 full blocks (24 prompt and 4 output tokens) are evicted from memory, and
    # so written, tail first (the tail of a prefix is evicted before its head): the last 3
    # written, its head, stay
    evict_prompt(llm)
    settled(llm)
    assert len(files(tmp_path)) == 3 and llm.stats().kv_disk_evictions == 4
    before = llm.stats()
    assert generate(llm, PROMPT) == cold
    assert llm.stats().kv_disk_hits - before.kv_disk_hits == 3 * BLOCK


@pytest.mark.parametrize("kwargs, flag", [
    ({"kv_offloading_backend": "disk"}, "kv_offloading_path"),
    ({"kv_offloading_backend": "nfs", "kv_offloading_path": "x"}, "kv_offloading_backend"),
    ({"kv_offloading_path": "x"}, "kv_offloading_backend"),
    ({"kv_offloading_backend": "disk", "kv_offloading_path": "x", "kv_offloading_size": -1},
     "kv_offloading_size"),
])
def test_bad_flags_name_themselves(tiny_llama, kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        LLM(str(tiny_llama), **kwargs)


def test_a_folder_that_cannot_be_made_names_the_flag(tiny_llama, tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="kv_offloading_path"):
        engine(tiny_llama, tmp_path / "file" / "tier")
