"""The KV block pool: every device block's reference count, the free queue, and the
copy-on-write copies made this step. Pure Python: it hands out block ids; the model side owns
the tensors they index.

It is the one place a block changes hands, so the rules of a hand-over live here:
- a free block still registered in the prefix cache stays reusable as a hit until taken;
  taking it evicts it, through the `evict` hook, before it has a new owner;
- a block released with a copy still pending into it loses the copy: nobody will read that
  block as the copy's request's (the copy belongs to whoever holds its destination).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class BlockMeta:
    ref_cnt: int = 0  # the pool's; the rest is the prefix cache's (core/prefix_cache.py)
    hash: int | None = None  # set while the block is registered in the prefix cache
    parent_hash: int | None = None  # with `tokens`, re-checked on a hit: hashes collide
    tokens: tuple[int, ...] = ()
    disk_key: bytes | None = None  # its stable key (kv_disk_keys.py), with a disk tier


class BlockPool:
    def __init__(self, num_blocks: int, evict: Callable[[int], None]) -> None:
        """`evict(block_id)`: a block registered in the prefix cache is being taken."""
        self.num_blocks = num_blocks
        self.blocks = [BlockMeta() for _ in range(num_blocks)]
        # Blocks nobody references, least recently used first. Registered ones stay
        # reusable here until taking one evicts it.
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._evict = evict
        # Copy-on-write copies made this step, destination -> source.
        self.pending_copies: dict[int, int] = {}
        # Prefix hits are registered blocks, so only touch and release (or an eviction)
        # move one into or out of the free queue: the count of those in it is kept for the
        # last hits asked about (the head of the waiting queue, asked again every step).
        self._num_hits_moved = 0
        self._free_hits: tuple[list[int], int, int, int] = ([], 0, 0, 0)

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def take(self) -> int:
        """The least recently used free block, evicted from the prefix cache if it was
        registered there, now referenced once."""
        block_id, _ = self.free_queue.popitem(last=False)
        meta = self.blocks[block_id]
        if meta.hash is not None:
            self._evict(block_id)
        meta.ref_cnt = 1
        return block_id

    def take_copy_of(self, shared: int) -> int:
        """A block of its own for a holder of `shared` about to write into it: the holder's
        reference moves to a new block, which the model side fills from `shared` this step."""
        self.blocks[shared].ref_cnt -= 1
        block_id = self.take()
        self.pending_copies[block_id] = shared
        return block_id

    def touch(self, block_id: int) -> None:
        """One more reference (a prefix hit taken, a fork's shared block)."""
        meta = self.blocks[block_id]
        if meta.ref_cnt == 0:
            del self.free_queue[block_id]
            self._num_hits_moved += 1
        meta.ref_cnt += 1

    def release(self, block_ids: list[int]) -> None:
        """Drop one reference to each block, tail first, so that the tail of a shared
        prefix is evicted before its head."""
        for block_id in reversed(block_ids):
            meta = self.blocks[block_id]
            meta.ref_cnt -= 1
            if meta.ref_cnt == 0:
                self.pending_copies.pop(block_id, None)
                self.free_queue[block_id] = None
                self._num_hits_moved += 1
                if meta.hash is None:  # nothing worth keeping: reuse it first
                    self.free_queue.move_to_end(block_id, last=False)

    def reuse_first(self, block_id: int) -> None:
        """A free block that no longer holds anything worth keeping is taken before the rest."""
        if self.blocks[block_id].ref_cnt == 0:
            self.free_queue.move_to_end(block_id, last=False)

    def keep_longest(self, block_ids: list[int]) -> int:
        """Those of the blocks that are free are taken after every other free block; how
        many they are."""
        free = [b for b in block_ids if self.blocks[b].ref_cnt == 0]
        for block_id in free:
            self.free_queue.move_to_end(block_id)
        return len(free)

    def source_of(self, block_id: int) -> int:
        """Where the block's contents are this step: a copy's source until the copy runs."""
        return self.pending_copies.get(block_id, block_id)

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """This step's copy-on-write copies as (source, destination) pairs."""
        copies = [(src, dst) for dst, src in self.pending_copies.items()]
        self.pending_copies.clear()
        return copies

    def num_freed_by(self, block_ids: list[int], keep: set[int] = frozenset()) -> int:
        """Blocks that would return to the free queue if released once, not counting `keep`."""
        return sum(1 for b in block_ids if self.blocks[b].ref_cnt == 1 and b not in keep)

    def num_free_of(self, hits: list[int], num_evictions: int) -> int:
        """Of the prefix hits, those in the free queue: they leave it when touched. Kept
        while no hit moved and the prefix cache's `num_evictions` stands."""
        last_hits, evictions, moved, num = self._free_hits
        if evictions != num_evictions or moved != self._num_hits_moved or last_hits != hits:
            blocks = self.blocks  # (a list's count: a waiting head's hits run to thousands)
            num = [blocks[b].ref_cnt for b in hits].count(0)
            self._free_hits = (list(hits), num_evictions, self._num_hits_moved, num)
        return num
