"""The disk tier of the prefix cache (--kv-offloading-backend disk): blocks the prefix cache
evicts from memory are written here, and loaded back when a prompt misses memory but hits
here (core/kv_cache.py decides which; this module moves the bytes).

One file per block, named by its stable key (core/kv_disk_keys.py), in a folder per
identity under --kv-offloading-path: the model (its path, config and weight files' sizes
and mtimes), the activation and KV dtypes, the quantization, the block size, the shapes of
the tensors of a block and the format version. Another model, dtype or format looks in
another folder; the header repeats the identity and the key, and a checksum covers the
payload (model/kv_disk_format.py), so a file copied, torn or flipped is refused (and
deleted), never read as KV. Files are written to a temporary name, then renamed into place
(atomic). A restarted engine rebuilds its index by scanning its folder, least recently used
first by mtime.

The I/O overlaps the steps. An evicted block's bytes are copied out of the cache at once
(its block is reused in the same step), then checksummed and written by a writer thread
while the forward runs; the key counts as here from the start, and a stage of it before
its file is in place is served from the copy. The blocks of a request still waiting are
read and checked by a prefetch thread (`prefetch`), so that the step that admits it finds
them checked (`stage`) instead of reading them then.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

import torch

from minivllm.model.background_worker import BackgroundWorker
from minivllm.model.kv_disk_format import (
    FORMAT_VERSION,
    PREFETCH_BYTES,
    WRITE_QUEUE_BYTES,
    decode,
    encode,
    file_size,
)

logger = logging.getLogger(__name__)

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


def model_fingerprint(model_path, hf_config) -> str:
    """The model's config, and the names, sizes and mtimes of its weight files."""
    h = hashlib.blake2b(hf_config.to_json_string(use_diff=False).encode(), digest_size=16)
    path = Path(model_path)
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    for file in files:
        if file.suffix in _WEIGHT_SUFFIXES:
            stat = file.stat()
            h.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return h.hexdigest()


def _remove(path: Path) -> None:
    """Delete a temporary file if it is there; one that cannot be deleted is left to the
    next start's scan."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


class _Chain:
    """One prefetch call's blocks, a request's in order. The prefetcher stops reading them
    at the first that fails its check (a stage stops there too), or once a stage takes
    over one still queued: the stage reads the rest in order itself in the same step. So
    a bad file is found first by whichever reads the request's blocks in order, and no
    block past it is read."""
    stopped = False


class DiskKVStore:
    def __init__(self, root: str, capacity_bytes: int, identity: dict,
                 tensors: tuple[torch.Tensor, ...], prefetch_bytes: int = PREFETCH_BYTES,
                 shared: bool = False) -> None:
        """`identity`: what a block's bytes depend on beside its key (see the module's
        docstring); `tensors`: the cache tensors of every layer, [layers, blocks, ...] each
        (model/kv_quant.py's tensors(): a quantized cache's scales too). `shared`: other
        processes write the folder too (--kv-transfer-config): a key the index lacks is
        looked up on disk."""
        self.capacity, self.shared = capacity_bytes, shared
        self.tensors = tensors
        self.block_bytes = sum(t[:, 0].numel() * t.element_size() for t in tensors)
        self.identity = {**identity, "format": FORMAT_VERSION, "block": [
            [list(t.shape[:1]) + list(t.shape[2:]), str(t.dtype)] for t in tensors]}
        digest = hashlib.blake2b(json.dumps(self.identity, sort_keys=True).encode(),
                                 digest_size=8).hexdigest()
        self.dir = Path(root).expanduser() / digest
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"kv_offloading_path (--kv-offloading-path) {root!r}: cannot "
                             f"create {self.dir}: "
                             f"{e.strerror or e}") from None
        # Thread safety: the engine's thread (scheduler and runner) calls the public
        # methods; the writer and the prefetcher run the jobs they queue. Every field below
        # but _staged and _closed (the engine's alone) is changed under _lock (the counters
        # are read unlocked by the stats: an int a step old at worst), and so are the
        # rename that puts a written file in place and the unlink that drops a key, so a
        # drop and a write's completion cannot interleave. File reads, writes and checksums
        # run outside it. A key leaves the index only under the lock, by the engine's
        # thread (_drop), by the writer (its write failed: a pending key) or by the
        # prefetcher (its file failed its check: a key whose prefetch is still queued), so
        # the engine may read a key's file unlocked once it is neither.
        self._lock = threading.Lock()
        self.index: OrderedDict[bytes, int] = OrderedDict()  # key -> file bytes, LRU first
        self.used = 0
        self._pending: dict[bytes, bytearray] = {}  # keys being written -> their bytes
        # Keys queued for the prefetcher -> the prefetch call's chain, their job's ticket (a
        # stage or a drop of the key takes it back: the job's result is then dropped), and
        # the payloads it has read and checked, oldest first; together at most
        # _prefetch_limit blocks.
        self._queued: dict[bytes, _Chain] = {}
        self._prefetched: OrderedDict[bytes, bytearray] = OrderedDict()
        self._prefetch_limit = max(1, prefetch_bytes // self.block_bytes)
        self._staged: dict[bytes, bytearray] = {}  # checked payloads for this step's loads
        self._closed = False
        self.bytes_read = self.bytes_written = self.evictions = self.corrupt = 0
        self._scan()
        self._writer = BackgroundWorker("kv-disk-writer", self._write_file,
                                        max(1, WRITE_QUEUE_BYTES // self.block_bytes))
        self._prefetcher = BackgroundWorker("kv-disk-prefetch", self._prefetch_file,
                                            self._prefetch_limit)

    # ---- the index (under _lock) ------------------------------------------------------

    def _scan(self) -> None:
        """Index the files a previous run left, oldest first; leftover temporary files
        (a write cut short) are deleted. Headers are checked when a block is read."""
        entries = []
        for path in self.dir.iterdir():
            if path.suffix == ".tmp":
                path.unlink(missing_ok=True)
            elif path.suffix == ".kv":
                try:
                    key, stat = bytes.fromhex(path.stem), path.stat()
                except (ValueError, OSError):
                    continue
                entries.append((stat.st_mtime_ns, key, stat.st_size))
        with self._lock:
            for _, key, size in sorted(entries):
                self.index[key] = size
                self.used += size
            self._evict_to(self.capacity)
        if self.index:
            logger.info("KV disk tier %s: %d blocks (%.1f MiB) from a previous run",
                        self.dir, len(self.index), self.used / (1 << 20))

    def _path(self, key: bytes) -> Path:
        return self.dir / f"{key.hex()}.kv"

    def _knows(self, key: bytes) -> bool:
        """Whether the key is indexed; in a shared folder, a file another process wrote
        since is indexed now (its check comes when it is read)."""
        if key in self.index:
            return True
        if not self.shared:
            return False
        try:
            size = self._path(key).stat().st_size
        except OSError:
            return False
        self.index[key] = size
        self.used += size
        return True

    def _drop(self, key: bytes) -> None:
        """Forget the key and delete its file; a write or prefetch of it still queued is
        dropped when its turn comes."""
        self.used -= self.index.pop(key)
        self._pending.pop(key, None)
        self._queued.pop(key, None)
        self._prefetched.pop(key, None)
        self._path(key).unlink(missing_ok=True)

    def _evict_to(self, limit: int) -> None:
        while self.index and self.used > limit:
            self._drop(next(iter(self.index)))
            self.evictions += 1

    def _refuse(self, key: bytes) -> None:
        self.corrupt += 1
        logger.warning("KV disk tier: %s failed its check; deleted (recomputed)",
                       self._path(key).name)
        self._drop(key)

    def _touch(self, key: bytes) -> None:
        self.index.move_to_end(key)
        if key not in self._pending:  # (a file still to be written gets a new mtime)
            with contextlib.suppress(OSError):  # deleted by hand: a miss next time
                os.utime(self._path(key))  # the LRU order a restart rebuilds

    # ---- what the KV manager asks ---------------------------------------------------

    def stage(self, key: bytes) -> bool:
        """Whether the block is here and whole, its payload kept for this step's load: the
        copy of a write still pending, a prefetched payload, or else its file read and
        checked now (header, length, checksum). A bad file is deleted."""
        if key in self._staged:
            return True
        with self._lock:
            if not self._knows(key):
                return False
            payload = self._pending.get(key)
            if payload is None:
                payload = self._prefetched.pop(key, None)
            chain = self._queued.pop(key, None)  # a prefetch to finish: read it here instead
            if chain is not None:
                chain.stopped = True
            if payload is not None:
                self._touch(key)
                self._staged[key] = payload
                return True
        payload = self._read(key)  # unlocked: neither pending nor queued, only we drop it
        with self._lock:
            if payload is None:
                self._refuse(key)
                return False
            self.bytes_read += self.index[key]
            self._touch(key)
        self._staged[key] = payload
        return True

    def prefetch(self, keys: list[bytes]) -> None:
        """Have the prefetcher read and check the blocks of `keys` (a waiting request's, in
        order) that are here, for a later stage: up to the first that is not (the stage
        stops there too), as long as the prefetch room lasts (the oldest prefetched
        payloads, never staged, give theirs up)."""
        if self._closed:
            return
        chain = _Chain()
        with self._lock:
            for key in keys:
                if not self._knows(key):
                    return
                if key in self._pending or key in self._queued or key in self._staged:
                    continue
                if key in self._prefetched:
                    self._prefetched.move_to_end(key)
                    continue
                if len(self._queued) + len(self._prefetched) >= self._prefetch_limit:
                    if not self._prefetched:
                        return
                    self._prefetched.popitem(last=False)
                self._queued[key] = chain
                if not self._prefetcher.submit((key, chain), wait=False):
                    del self._queued[key]
                    return

    def _read(self, key: bytes) -> bytearray | None:
        try:
            data = self._path(key).read_bytes()
        except OSError:
            return None
        return decode(data, self.identity, key)

    def _prefetch_file(self, job: tuple[bytes, _Chain]) -> None:
        """The prefetcher: read and check a key's file (a bad one is deleted, as in stage)."""
        key, chain = job
        with self._lock:
            if self._queued.get(key) is not chain:
                return  # staged or dropped before its turn
            if chain.stopped:
                del self._queued[key]
                return
        payload = self._read(key)
        with self._lock:
            if self._queued.get(key) is not chain:
                return  # staged (and read there) or dropped meanwhile
            del self._queued[key]
            if payload is None:
                self._refuse(key)
                chain.stopped = True
                return
            self.bytes_read += self.index[key]
            self._prefetched[key] = payload

    def clear(self) -> int:
        """Delete every block file and the index (POST /reset_prefix_cache?reset_external=
        true); how many blocks were deleted. The counters stay: they are cumulative. Writes
        and prefetches still queued are dropped when their turn comes (_drop)."""
        with self._lock:
            num = len(self.index)
            for key in list(self.index):
                self._drop(key)
        self._staged.clear()
        return num

    # ---- what the runner does -------------------------------------------------------

    def _views(self, payload: bytearray):
        """Each cache tensor with a block of it ([layers, ...], its dtype) over the payload."""
        offset = 0
        for t in self.tensors:
            block = t[:, 0]
            size = block.numel() * block.element_size()
            yield t, torch.frombuffer(payload, dtype=torch.uint8, count=size,
                                      offset=offset).view(t.dtype).view(block.shape)
            offset += size

    def write(self, blocks: list[tuple[int, bytes]]) -> None:
        """Evicted blocks (block id, key) not here yet: their bytes copied out now, before
        their blocks are reused, and their files written by the writer thread (the step
        waits only when its queue is full)."""
        for block_id, key in blocks:
            with self._lock:
                if key in self.index:
                    self.index.move_to_end(key)
                    continue
                size = file_size(self.identity, key, self.block_bytes)
                if size > self.capacity:
                    continue  # the tier is too small to hold a block
                self._evict_to(self.capacity - size)
                payload = bytearray(self.block_bytes)
                for t, view in self._views(payload):
                    view.copy_(t[:, block_id])
                self.index[key] = size
                self.used += size
                self._pending[key] = payload
            if self._closed:  # a second shutdown: written here and now
                self._write_file((key, payload))
            else:  # unlocked: a full queue waits for the writer, which takes the lock
                self._writer.submit((key, payload), wait=True)

    def write_now(self, blocks: list[tuple[int, bytes]]) -> None:
        """write, and return once every file is in place (a producer's blocks, before the
        step's outputs leave: the consumer sent the request next finds them)."""
        self.write(blocks)
        if not self._closed:
            self._writer.drain()

    def _write_file(self, job: tuple[bytes, bytearray]) -> None:
        """The writer: checksum and write a block to a temporary file, then rename it into
        place -- unless its key was dropped meanwhile. A failing disk (full, read-only)
        costs the block, recomputed when next asked for, never the engine."""
        key, payload = job
        data = encode(self.identity, key, payload)
        path, tmp = self._path(key), self.dir / f"{key.hex()}.{os.getpid()}.tmp"
        error = None
        try:
            tmp.write_bytes(data)
        except OSError as e:
            error = e
        with self._lock:
            if self._pending.get(key) is not payload:
                _remove(tmp)  # dropped: its file must not appear
                return
            del self._pending[key]
            if error is None:
                try:
                    os.replace(tmp, path)
                except OSError as e:
                    error = e
            if error is not None:
                logger.warning("KV disk tier: cannot write %s: %s", path, error)
                self.used -= self.index.pop(key)
                _remove(tmp)
                return
            self.bytes_written += len(data)

    def load(self, blocks: list[tuple[bytes, int]]) -> None:
        """Fill blocks (key, block id) from their staged payloads, then drop the rest (a
        load dropped because its block was evicted again in the step)."""
        for key, block_id in blocks:
            for t, view in self._views(self._staged.pop(key)):
                t[:, block_id].copy_(view)
        self._staged.clear()

    # ---- background I/O ---------------------------------------------------------------

    def drain(self) -> None:
        """Wait until the writes and prefetches queued so far are done (tests, benchmarks)."""
        self._writer.drain()
        self._prefetcher.drain()

    def close(self) -> None:
        """Finish the queued writes (a stopped engine has written everything), drop the
        queued prefetches, and stop both threads; later writes are written at once."""
        self._closed = True
        with self._lock:
            self._queued.clear()
        self._prefetcher.close()
        self._writer.close()
