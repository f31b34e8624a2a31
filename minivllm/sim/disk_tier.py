"""The simulator's disk tier of the prefix cache (--kv-offloading-backend disk): the index of
model/kv_disk.py's DiskKVStore without its files. The KV manager (core/kv_cache.py) asks it
what the real one answers (`stage`), the simulated replica hands it each step's transfers as
the model runner does (`write`, then `load`), and the scheduler's stats read the same
counters; capacity is in bytes, least recently used blocks dropped beyond it. A block's bytes
are the KV cache's (sim/kv_bytes.py); a file's small header is not counted.

The real store's I/O overlaps the steps, and so does this one's timing: a waiting request's
blocks are prefetched (`prefetch`), and a block prefetched in an earlier step than the one
that loads it costs that step no read (we assume the prefetch thread read it meanwhile); the
writer thread writes while steps run, and a step waits only when the blocks waiting for it
pass its queue's bytes (`write_stall_bytes`)."""

from __future__ import annotations

from collections import OrderedDict

from minivllm.model.kv_disk_format import WRITE_QUEUE_BYTES


class SimDiskTier:
    def __init__(self, capacity_bytes: int, block_bytes: int,
                 index: OrderedDict[bytes, None] | None = None) -> None:
        if capacity_bytes <= 0 or block_bytes <= 0:
            raise ValueError(f"a disk tier needs a capacity and a block size in bytes > 0, "
                             f"got {capacity_bytes} and {block_bytes}")
        self.capacity, self.block_bytes = capacity_bytes, block_bytes
        self.index: OrderedDict[bytes, None] = index if index is not None else OrderedDict()
        self._staged: set[bytes] = set()
        self._prefetched: dict[bytes, int] = {}  # key -> the step it was asked for in
        self._in_step_reads = 0  # this step's staged blocks that were not prefetched before
        self._steps = 0
        self._write_backlog, self._backlog_at = 0.0, 0.0  # bytes queued for the writer, when
        self.bytes_read = self.bytes_written = self.evictions = 0
        self.corrupt = 0  # (no files: none is ever torn)

    @property
    def used(self) -> int:
        return len(self.index) * self.block_bytes

    def reopened(self) -> SimDiskTier:
        """The tier a restarted engine finds: the same blocks in the same LRU order, its
        counters at zero (DiskKVStore rebuilding its index from its folder)."""
        return SimDiskTier(self.capacity, self.block_bytes, OrderedDict(self.index))

    def stage(self, key: bytes) -> bool:
        """Whether the block is here; if so it is read now, for this step's load."""
        if key in self._staged:
            return True
        if key not in self.index:
            return False
        self.index.move_to_end(key)
        self._staged.add(key)
        if self._prefetched.pop(key, self._steps) >= self._steps:
            self._in_step_reads += 1
        self.bytes_read += self.block_bytes
        return True

    def prefetch(self, keys: list[bytes]) -> None:
        """A waiting request's blocks, in order, up to the first not here."""
        for key in keys:
            if key not in self.index:
                return
            self._prefetched.setdefault(key, self._steps)

    def write(self, blocks: list[tuple[int, bytes]]) -> int:
        """Store evicted blocks (block id, key) not here yet; how many were written (one
        already here is only marked recently used, as DiskKVStore does)."""
        if self.block_bytes > self.capacity:
            return 0  # the tier is too small to hold a block
        written = 0
        for _, key in blocks:
            if key in self.index:
                self.index.move_to_end(key)
                continue
            while self.used + self.block_bytes > self.capacity:
                evicted, _ = self.index.popitem(last=False)
                self._prefetched.pop(evicted, None)  # (a long trace's marks stay bounded)
                self.evictions += 1
            self.index[key] = None
            self.bytes_written += self.block_bytes
            written += 1
        return written

    def load(self, blocks: list[tuple[bytes, int]]) -> int:
        """This step's loads are done (their bytes were counted when staged); how many were
        read in the step rather than prefetched before it."""
        read, self._in_step_reads = self._in_step_reads, 0
        self._staged.clear()
        self._steps += 1
        return read

    def write_stall_bytes(self, written: int, now: float, write_rate: float) -> float:
        """`written` blocks join the writer's queue at `now`, which drains at `write_rate`
        bytes/s: the bytes past the queue's room, which the step waits to write."""
        drained = (now - self._backlog_at) * write_rate
        self._write_backlog = max(0.0, self._write_backlog - drained)
        self._write_backlog += written * self.block_bytes
        self._backlog_at = now
        return max(0.0, self._write_backlog - WRITE_QUEUE_BYTES)
