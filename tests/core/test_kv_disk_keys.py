"""The disk tier's side of KVCacheManager, without a model: stable block keys (the same in
every process, apart for every salt and adapter), and the transfers it asks of the runner --
evicted blocks written, disk hits loaded into free blocks -- with a fake store."""

from __future__ import annotations

import os
import subprocess
import sys

from minivllm.core.kv_cache import KVCacheManager
from minivllm.core.kv_disk_keys import extend_disk_keys
from minivllm.lora.request import LoRARequest
from tests.core.test_kv_cache import compute, request

PROMPT = list(range(1, 10))  # two full blocks of 4


def keys(**fields) -> list[bytes]:
    return extend_disk_keys([], request("r", PROMPT, **fields), 4)


def test_keys_are_the_same_in_another_process():
    """Python's hash() of the same tuple differs between processes; these keys must not."""
    code = ("from tests.core.test_kv_disk_keys import keys; "
            "print(keys(cache_salt='s')[-1].hex())")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
    assert other == keys(cache_salt="s")[-1].hex()


def test_keys_differ_by_salt_adapter_and_tokens():
    adapter = LoRARequest("a", 1, "/adapters/a")
    variants = [keys(), keys(cache_salt="s"), keys(lora_request=adapter),
                keys(lora_request=LoRARequest("b", 1, "/adapters/b")),
                extend_disk_keys([], request("r", [0] + PROMPT[1:]), 4)]
    assert len({k[0] for k in variants}) == len(variants)
    # the adapter is named by name and path, not by this run's lora_int_id
    assert keys(lora_request=LoRARequest("a", 7, "/adapters/a")) == keys(lora_request=adapter)


class FakeStore:
    def __init__(self, held=()) -> None:
        self.held = set(held)
        self.prefetched: list[list[bytes]] = []

    def stage(self, key: bytes) -> bool:
        return key in self.held

    def prefetch(self, keys: list[bytes]) -> None:
        self.prefetched.append(keys)


def test_evicted_blocks_are_written_and_disk_hits_loaded():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    kv.disk = FakeStore()
    first = request("a", PROMPT)
    compute(kv, first, 9)
    kv.free(first)
    other = request("b", list(range(50, 59)))
    compute(kv, other, 9)  # takes all 3 blocks
    writes, loads = kv.take_disk_transfers()
    assert [key for _, key in writes] == first.disk_keys[::-1] and not loads  # tail first
    kv.free(other)
    kv.disk = FakeStore(first.disk_keys)
    again = request("c", PROMPT)
    assert kv.find_cached_blocks(again) == []
    assert kv.load_from_disk(again, []) == 2
    hits = kv.find_cached_blocks(again)
    writes, loads = kv.take_disk_transfers()
    assert loads == list(zip(first.disk_keys, hits))
    # they took b's partial block (nothing to keep), then its tail block: written first
    assert [key for _, key in writes] == other.disk_keys[1:]


def test_a_block_still_to_load_is_neither_written_nor_swapped_out():
    kv = KVCacheManager(num_blocks=4, block_size=4, num_swap_blocks=8)
    held = request("a", PROMPT)
    kv.disk = FakeStore(kv.disk_keys(held))
    assert kv.load_from_disk(held, []) == 2
    compute(kv, held, 1, kv.find_cached_blocks(held))
    assert kv.swap_out(held) is None  # its host copy would be taken before the load
    kv.free(held)
    compute(kv, request("b", list(range(50, 63))), 13)  # evicts the two loaded blocks
    writes, loads = kv.take_disk_transfers()
    assert writes == [] and loads == []  # the loads dropped; the bytes are on disk already


def test_a_waiting_request_has_its_blocks_past_memory_prefetched():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    kv.disk = FakeStore()
    first = request("a", PROMPT[:5])
    compute(kv, first, 5)  # PROMPT's first block, cached in memory
    kv.free(first)
    waiting = request("b", PROMPT)
    kv.prefetch_from_disk(waiting)
    assert kv.disk.prefetched == [kv.disk_keys(waiting)[1:2]]  # a hit leaves one token
    kv.prefetch_from_disk(request("c", PROMPT[:5]))  # all in memory: nothing to ask
    assert len(kv.disk.prefetched) == 1
