"""DiskKVStore's background I/O, without a model, on a small cache: a block being written is
served from its copy, close() waits for the writer, a prefetched block is staged without a
second read, a bad file the prefetcher finds is deleted and never loaded, a failing disk
costs only the block, and a key evicted while its write is pending leaves no file."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest
import torch

from minivllm.model import kv_disk
from minivllm.model.kv_disk import DiskKVStore
from minivllm.model.kv_disk_format import file_size

KEYS = [bytes([i]) * 16 for i in range(4)]


def cache() -> tuple[torch.Tensor, ...]:
    """K, V ([layers, blocks, ...]) and int8-style per-token scales, all distinct values."""
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(2, 4, 3, 5, generator=gen), torch.randn(2, 4, 3, 5, generator=gen),
            torch.randn(2, 4, 3, generator=gen).to(torch.bfloat16))


def open_store(path: Path, tensors, capacity: int = 1 << 30) -> DiskKVStore:
    return DiskKVStore(str(path), capacity, {"model": "test"}, tensors)


def files(store: DiskKVStore) -> list[str]:
    return sorted(p.name for p in store.dir.iterdir())


def block(tensors, block_id: int) -> list[torch.Tensor]:
    return [t[:, block_id].clone() for t in tensors]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture
def gate(monkeypatch) -> threading.Event:
    """Holds the writer before it checksums a block, until set."""
    event, encode = threading.Event(), kv_disk.encode

    def held(*args):
        event.wait()
        return encode(*args)

    monkeypatch.setattr(kv_disk, "encode", held)
    return event


@pytest.fixture
def readers(monkeypatch) -> list[str]:
    """The threads that read (and checked) a block file, one entry a read."""
    names, decode = [], kv_disk.decode

    def counted(*args):
        names.append(threading.current_thread().name)
        return decode(*args)

    monkeypatch.setattr(kv_disk, "decode", counted)
    return names


def test_a_block_still_being_written_is_staged_from_its_copy(tmp_path, gate, readers):
    tensors = cache()
    store, written = open_store(tmp_path, tensors), block(tensors, 1)
    store.write([(1, KEYS[0])])
    for t in tensors:
        t[:, 1] = 0  # the block is reused at once: its bytes live on only in the copy
    assert files(store) == [] and KEYS[0] in store.index  # pending counts as here
    assert store.stage(KEYS[0])
    store.load([(KEYS[0], 2)])
    assert same(block(tensors, 2), written) and readers == []
    gate.set()
    store.drain()
    assert files(store) == [f"{KEYS[0].hex()}.kv"] and store.bytes_written > 0
    store.close()


def test_close_returns_once_every_queued_write_is_on_disk(tmp_path, monkeypatch):
    encode = kv_disk.encode

    def slow(*args):
        threading.Event().wait(0.05)
        return encode(*args)

    monkeypatch.setattr(kv_disk, "encode", slow)
    tensors = cache()
    store = open_store(tmp_path, tensors)
    store.write([(b, KEYS[b]) for b in range(4)])
    store.close()
    assert files(store) == sorted(f"{k.hex()}.kv" for k in KEYS)
    store.write([(0, bytes([9]) * 16)])  # a second shutdown's: written at once
    assert len(files(store)) == len(KEYS) + 1
    reopened = open_store(tmp_path, tensors)
    assert all(reopened.stage(k) for k in KEYS)
    reopened.close()


def test_a_prefetched_block_is_staged_without_a_second_read(tmp_path, readers):
    tensors = cache()
    store, written = open_store(tmp_path, tensors), block(tensors, 1)
    store.write([(1, KEYS[0])])
    store.close()
    reopened = open_store(tmp_path, tensors)
    reopened.prefetch([KEYS[0]])
    reopened.drain()
    assert readers == ["kv-disk-prefetch"]
    assert reopened.stage(KEYS[0])
    reopened.load([(KEYS[0], 3)])
    assert readers == ["kv-disk-prefetch"] and same(block(tensors, 3), written)
    assert reopened.bytes_read == reopened.index[KEYS[0]]
    reopened.close()


def test_a_bad_file_the_prefetcher_finds_is_deleted_and_never_loaded(tmp_path, readers):
    tensors = cache()
    store = open_store(tmp_path, tensors)
    store.write([(0, KEYS[0]), (1, KEYS[1])])
    store.close()
    path = store.dir / f"{KEYS[0].hex()}.kv"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # in the payload: only the checksum can tell
    path.write_bytes(bytes(data))
    reopened = open_store(tmp_path, tensors)
    reopened.prefetch([KEYS[0], KEYS[1]])  # a request's blocks, in order
    reopened.drain()
    # the first is refused and deleted; the one after it is not read (a stage stops there)
    assert readers == ["kv-disk-prefetch"] and reopened.corrupt == 1
    assert files(reopened) == [f"{KEYS[1].hex()}.kv"]
    assert not reopened.stage(KEYS[0]) and readers == ["kv-disk-prefetch"]
    reopened.close()


def test_a_failing_disk_costs_the_block_not_the_engine(tmp_path, monkeypatch):
    tensors = cache()
    store = open_store(tmp_path, tensors)

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full)
    store.write([(0, KEYS[0])])
    store.drain()
    assert KEYS[0] not in store.index and store.used == 0 and files(store) == []
    assert not store.stage(KEYS[0])  # a miss: recomputed
    store.close()


def test_a_key_evicted_while_its_write_is_pending_leaves_no_file(tmp_path, gate):
    tensors = cache()
    probe = open_store(tmp_path / "probe", tensors)
    one_file = file_size(probe.identity, KEYS[0], probe.block_bytes)
    probe.close()
    store = open_store(tmp_path, tensors, capacity=one_file)
    store.write([(0, KEYS[0]), (1, KEYS[1])])  # the second evicts the first, still pending
    assert list(store.index) == [KEYS[1]] and store.evictions == 1
    gate.set()
    store.drain()
    assert files(store) == [f"{KEYS[1].hex()}.kv"] and store.used == one_file
    store.close()
