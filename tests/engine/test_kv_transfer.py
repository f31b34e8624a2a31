"""Prefill/decode disaggregation through a shared folder (--kv-transfer-config, vLLM's
SharedStorageConnector; core/kv_transfer.py) on the tiny llama: a producer engine runs a
prompt for one token and its blocks are in the folder when the step returns; a consumer
engine started before them finds them, loads them instead of computing them, and its
greedy output is a colocated engine's; a damaged transfer is refused and recomputed; the
roles keep their own blocks to themselves; bad configs are refused by name."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from minivllm.config import EngineConfig
from tests.engine.test_kv_disk_tier import BLOCK, HIT_TOKENS, PROMPT, files, generate

OTHER = list(range(100, 124))  # another prompt of 24 tokens


def connector(role: str, path) -> dict:
    return {"kv_connector": "SharedStorageConnector", "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": str(path)}}


def instance(model, role: str, path) -> LLM:
    return LLM(str(model), num_kv_blocks=12, block_size=BLOCK,
               kv_transfer_config=connector(role, path))


def prefill(llm: LLM, tokens: list[int]) -> list[int]:
    """What a disaggregating proxy sends a prefill instance: the prompt, for one token."""
    out = llm.generate([{"prompt_token_ids": tokens}], SamplingParams(temperature=0,
                                                                      max_tokens=1),
                       use_tqdm=False)
    return list(out[0].outputs[0].token_ids)


@pytest.fixture(scope="module")
def colocated(tiny_llama) -> list[int]:
    return generate(LLM(str(tiny_llama), num_kv_blocks=12, block_size=BLOCK), PROMPT)


def test_the_consumer_loads_what_the_producer_computed(tiny_llama, tmp_path, colocated):
    producer = instance(tiny_llama, "kv_producer", tmp_path)
    consumer = instance(tiny_llama, "kv_consumer", tmp_path)  # started before the files
    assert not files(tmp_path)
    assert prefill(producer, PROMPT) == colocated[:1]
    assert len(files(tmp_path)) == len(PROMPT) // BLOCK  # in place when the step returned
    assert generate(consumer, PROMPT) == colocated
    stats = consumer.stats()
    assert stats.kv_disk_hits == HIT_TOKENS  # all but the block holding the last token
    assert stats.num_computed_tokens == len(PROMPT) - HIT_TOKENS + 5
    # the consumer wrote nothing of its own to the folder, even when stopping
    consumer.llm_engine.core.shutdown()
    assert len(files(tmp_path)) == len(PROMPT) // BLOCK


def test_a_producer_loads_nothing_and_kv_both_does_both(tiny_llama, tmp_path, colocated):
    prefill(instance(tiny_llama, "kv_producer", tmp_path), PROMPT)
    again = instance(tiny_llama, "kv_producer", tmp_path)
    prefill(again, PROMPT)
    assert again.stats().kv_disk_hits == 0
    both = instance(tiny_llama, "kv_both", tmp_path)
    assert generate(both, PROMPT) == colocated and both.stats().kv_disk_hits == HIT_TOKENS
    # and writes every block it fills: PROMPT's 6 were there, its output filled a 7th (24
    # prompt tokens and 4 of its 6 output tokens computed), OTHER's are 6 more
    prefill(both, OTHER)
    assert len(files(tmp_path)) == 6 + 1 + 6


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_transfer_is_recomputed(tiny_llama, tmp_path, colocated, damage):
    prefill(instance(tiny_llama, "kv_producer", tmp_path), PROMPT)
    for path in files(tmp_path):
        data = bytearray(path.read_bytes())
        if damage == "flip":
            data[-1] ^= 0xFF
        else:
            data = data[:len(data) // 2]
        path.write_bytes(bytes(data))
    consumer = instance(tiny_llama, "kv_consumer", tmp_path)
    assert generate(consumer, PROMPT) == colocated
    stats = consumer.stats()
    assert stats.kv_disk_hits == 0 and stats.kv_disk_corrupt >= 1
    assert stats.num_computed_tokens == len(PROMPT) + 5


@pytest.mark.parametrize("config, message", [
    ({"kv_connector": "NixlConnector", "kv_role": "kv_producer"}, "unknown kv_connector"),
    ({"kv_connector": "SharedStorageConnector", "kv_role": "kv_sender"}, "kv_role must be"),
    ({"kv_connector": "SharedStorageConnector", "kv_role": "kv_both"},
     "needs kv_connector_extra_config's shared_storage_path"),
    ({"kv_role": "kv_both"}, "kv_connector is required"),
    ({**connector("kv_both", "/tmp/x"), "kv_rank": 0}, "unknown key(s) 'kv_rank'"),
])
def test_bad_configs_are_refused_by_name(config, message):
    with pytest.raises(ValueError, match="kv_transfer_config") as info:
        EngineConfig(kv_transfer_config=config)
    assert message in str(info.value)


def test_not_with_the_disk_tier_or_without_the_prefix_cache(tmp_path):
    with pytest.raises(ValueError, match="not with --kv-transfer-config"):
        EngineConfig(kv_transfer_config=connector("kv_both", tmp_path),
                     kv_offloading_backend="disk", kv_offloading_path=str(tmp_path))
    with pytest.raises(ValueError, match="drop --no-enable-prefix-caching"):
        EngineConfig(kv_transfer_config=connector("kv_both", tmp_path),
                     enable_prefix_caching=False)
