"""DiskConnector on its own: evicted blocks written, disk hits loaded, a block evicted while
still to be loaded neither loaded nor written, and the step's transfers taken once."""

from __future__ import annotations

from types import SimpleNamespace

from minivllm.core.kv_disk_connector import DiskConnector
from minivllm.core.request import Request


def test_evicted_blocks_with_a_key_are_written_in_eviction_order():
    disk = DiskConnector(block_size=4)
    disk.evicted(3, b"c")
    disk.evicted(1, None)  # registered without a disk tier: nothing to write
    disk.evicted(2, b"b")
    assert disk.take_transfers() == ([(3, b"c"), (2, b"b")], [])
    assert disk.take_transfers() == ([], [])


def test_a_block_evicted_before_its_load_is_neither_loaded_nor_written():
    disk = DiskConnector(block_size=4)
    disk.load(5, b"x")
    disk.load(6, b"y")
    assert disk.loading(5) and not disk.loading(7) and disk.hits == 2
    disk.evicted(5, b"x")
    assert not disk.loading(5)
    assert disk.take_transfers() == ([], [(b"y", 6)])
    assert not disk.loading(6)


def test_keys_are_asked_for_only_with_a_tier_attached():
    disk = DiskConnector(block_size=4)
    request = Request.make("r", list(range(9)), max_tokens=4)
    assert disk.keys_if_on(request) is None
    disk.store = object()
    assert disk.keys_if_on(request) == disk.keys(request) and len(request.disk_keys) == 2


def test_stats_are_zero_without_a_tier_and_the_tiers_with_one():
    disk = DiskConnector(block_size=4)
    assert set(disk.stats().values()) == {0}
    disk.store = SimpleNamespace(bytes_read=1, bytes_written=2, evictions=3, corrupt=4,
                                 index={b"a": None}, used=5, capacity=6)
    disk.load(0, b"a")
    assert disk.stats() == {"kv_disk_hits": 4, "kv_disk_bytes_read": 1,
                            "kv_disk_bytes_written": 2, "kv_disk_evictions": 3,
                            "kv_disk_corrupt": 4, "kv_disk_blocks": 1, "kv_disk_used_bytes": 5,
                            "kv_disk_capacity_bytes": 6}
