"""KV-cache bookkeeping: per-request block tables over four parts, each with one job --
the block pool (block_pool.py: reference counts, the free queue, copy-on-write copies), the
prefix-cache index (prefix_cache.py), the host swap space (swap_space.py), and the connector
to a disk tier (kv_disk_connector.py). Pure Python: it hands out block ids; the model side
owns the tensors they index.

The model side applies a step's block mappings in one order (ModelRunner.copy_blocks): disk
writes, swap-outs, disk loads, copy-on-write copies, swap-ins; each reads its blocks before
a later one can write them, so a block freed in a step may be handed out again in the same
step. What that order cannot see is settled where the mappings are made: a swap-out reads a
block still waiting for its copy from the copy's source (BlockPool.source_of; the release
drops the copy), and a request holding a block still to be loaded from disk is not swapped
out but recomputed (its host copy would be taken before the load).
"""

from __future__ import annotations

from minivllm.core.block_pool import BlockPool
from minivllm.core.kv_disk_connector import DiskConnector
from minivllm.core.prefix_cache import PrefixCache
from minivllm.core.request import Request
from minivllm.core.swap_space import SwapSpace


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        num_swap_blocks: int = 0,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.disk_connector = DiskConnector(block_size)
        self.pool = BlockPool(num_blocks, evict=self._evict)
        self.prefix_cache = PrefixCache(self.pool.blocks, block_size, enable_prefix_caching,
                                        self.disk_connector.keys_if_on)
        self.swap_space = SwapSpace(num_swap_blocks)

    def _evict(self, block_id: int) -> None:
        """The pool is taking a cached block: out of the index, and to the disk tier first."""
        self.disk_connector.evicted(block_id, self.prefix_cache.evict(block_id))

    # ---- the parts' state, as the scheduler, the engine and the tests read it -------------

    blocks = property(lambda self: self.pool.blocks)
    free_queue = property(lambda self: self.pool.free_queue)
    pending_copies = property(lambda self: self.pool.pending_copies)
    cached = property(lambda self: self.prefix_cache.cached)
    prefix_cache_queries = property(lambda self: self.prefix_cache.queries)
    prefix_cache_hits = property(lambda self: self.prefix_cache.hits)
    num_swap_blocks = property(lambda self: self.swap_space.num_blocks)
    free_swap_blocks = property(lambda self: self.swap_space.free_blocks)

    @property
    def disk(self):
        """The disk tier (model/kv_disk.py's DiskKVStore, sim/disk_tier.py's; None: off)."""
        return self.disk_connector.store

    @disk.setter
    def disk(self, store) -> None:
        self.disk_connector.store = store

    def stats(self) -> dict:
        """The KV cache's SchedulerStats fields."""
        return {"num_total_blocks": self.num_blocks, "num_free_blocks": self.num_free_blocks,
                "kv_cache_usage": self.usage, "num_total_swap_blocks": self.num_swap_blocks,
                "num_free_swap_blocks": len(self.free_swap_blocks),
                "prefix_cache_queries": self.prefix_cache.queries,
                "prefix_cache_hits": self.prefix_cache.hits, **self.disk_connector.stats()}

    # ---- capacity -------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_blocks_freed_by(self, request: Request, keep: set[int] = frozenset()) -> int:
        """Blocks that would return to the pool if the request let go of its own, not
        counting those in `keep` (prefix hits about to be taken again)."""
        return self.pool.num_freed_by(request.block_ids, keep)

    # ---- prefix cache ---------------------------------------------------------------

    def block_hashes(self, request: Request) -> list[int]:
        return self.prefix_cache.block_hashes(request)

    def find_cached_blocks(self, request: Request) -> list[int]:
        """The request's prefix hits, checked token by token (PrefixCache.find)."""
        return self.prefix_cache.find(request)

    def num_cached_tokens_probe(self, request: Request) -> int:
        """The tokens its prefix hits would serve, by hashes alone (PrefixCache.probe)."""
        return self.prefix_cache.probe(request)

    def record_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache.record_lookup(num_query_tokens, num_hit_tokens)

    def cache_full_blocks(self, request: Request) -> None:
        """Register the request's blocks that are now full of computed tokens."""
        self.disk_connector.filled(self.prefix_cache.register_full_blocks(request))

    def reset_prefix_cache(self, reset_external: bool = False) -> tuple[int, int]:
        """Forget every cached block (POST /reset_prefix_cache): a later prompt misses. The
        free ones become plain free blocks; those running requests hold stay theirs, valid
        and untouched, but no new request shares them any more. With `reset_external`, the
        disk tier's files go too. Between steps only (no transfer is pending then). Returns
        (blocks forgotten, disk blocks deleted)."""
        forgotten = self.prefix_cache.reset()
        for block_id in forgotten:
            self.pool.reuse_first(block_id)
        deleted = self.disk.clear() if reset_external and self.disk is not None else 0
        return len(forgotten), deleted

    # ---- disk tier ------------------------------------------------------------------

    def disk_keys(self, request: Request) -> list[bytes]:
        return self.disk_connector.keys(request)

    def _may_use_disk(self, request: Request) -> bool:
        return (self.disk is not None and not request.num_computed_tokens
                and self.enable_prefix_caching and self.disk_connector.loads)

    def prefetch_from_disk(self, request: Request) -> None:
        """A request starts waiting: the disk tier may read and check, in the background,
        its blocks past those memory holds now (by hashes alone: a hint), so that
        load_from_disk finds them checked when the request is admitted."""
        if not self._may_use_disk(request):
            return
        start, limit = (self.prefix_cache.num_in_memory(request),
                        self.prefix_cache.max_hit_blocks(request))
        if start < limit:
            self.disk.prefetch(self.disk_keys(request)[start:limit])

    def load_from_disk(self, request: Request, cached: list[int]) -> int:
        """Past its memory hits `cached`, bring the request's next blocks that the disk tier
        holds (checked whole: DiskKVStore.stage) into free blocks, registered in the cache
        like any other (the runner loads their bytes before this step's forward); return how
        many. Each takes the least recently used free block, as an allocation does -- never
        one of `cached`, which move to the recent end first."""
        if not self._may_use_disk(request):
            return 0
        limit = self.prefix_cache.max_hit_blocks(request)
        if len(cached) >= limit:
            return 0
        room = self.pool.num_free - self.pool.keep_longest(cached)
        keys, hashes = self.disk_keys(request), self.block_hashes(request)
        num = 0
        for index in range(len(cached), min(limit, len(cached) + room)):
            if hashes[index] in self.cached or not self.disk.stage(keys[index]):
                break
            block_id = self.pool.take()
            self.prefix_cache.register(request, index, block_id, keys[index])
            self.pool.release([block_id])  # free at the recent end: a hit about to be taken
            self.disk_connector.load(block_id, keys[index])
            num += 1
        return num

    def cached_for_disk(self) -> list[tuple[int, bytes]]:
        """Every block the prefix cache holds, (block, stable key), least recently used
        first: what a stopping engine writes to its disk tier, so that a restart finds the
        prefixes still in memory too (the evicted ones, and the blocks still to be loaded
        from there, are on disk already)."""
        blocks = self.pool.blocks
        free = [b for b in self.pool.free_queue if blocks[b].hash is not None]
        held = [b for b, meta in enumerate(blocks) if meta.hash is not None and meta.ref_cnt > 0]
        return [(b, blocks[b].disk_key) for b in free + held
                if blocks[b].disk_key is not None and not self.disk_connector.loading(b)]

    def take_disk_writes(self) -> list[tuple[int, bytes]]:
        """The disk writes queued since the step's transfers were taken (a producer's
        filled blocks, after the forward)."""
        return self.disk_connector.take_writes()

    def take_disk_transfers(self) -> tuple[list[tuple[int, bytes]], list[tuple[bytes, int]]]:
        """This step's disk writes, (block, key), and loads, (key, block)."""
        return self.disk_connector.take_transfers()

    # ---- allocation -----------------------------------------------------------------

    def _num_blocks_to_take(self, request: Request, num_new_tokens: int,
                            cached_blocks: list[int]) -> int:
        total = (request.num_computed_tokens + len(cached_blocks) * self.block_size
                 + num_new_tokens)
        need = max(0, self.blocks_needed(total) - len(request.block_ids) - len(cached_blocks))
        copy_on_write = self._shares_partial_block(request) and num_new_tokens > 0
        # the hits in the free queue leave it when taken
        reclaimed = self.pool.num_free_of(cached_blocks, self.prefix_cache.num_evictions)
        return need + copy_on_write + reclaimed

    def can_allocate(self, request: Request, num_new_tokens: int,
                     cached_blocks: list[int] | None = None, extra_free: int = 0) -> bool:
        """Whether allocate_slots would succeed (with `extra_free` more free blocks)."""
        need = self._num_blocks_to_take(request, num_new_tokens, cached_blocks or [])
        return need <= self.num_free_blocks + extra_free

    def allocate_slots(
        self, request: Request, num_new_tokens: int, cached_blocks: list[int] | None = None
    ) -> list[int] | None:
        """Make room for `num_new_tokens` more computed tokens. `cached_blocks` (prefix hits)
        are appended first. Returns the newly allocated block ids, or None when the pool
        cannot hold them (nothing is changed then; the scheduler preempts)."""
        cached_blocks = cached_blocks or []
        if not self.can_allocate(request, num_new_tokens, cached_blocks):
            return None
        if self._shares_partial_block(request) and num_new_tokens > 0:
            # It will write into a block its siblings still read: give it its own copy.
            request.block_ids[-1] = self.pool.take_copy_of(request.block_ids[-1])
        for block_id in cached_blocks:
            self.pool.touch(block_id)
        request.block_ids.extend(cached_blocks)
        total = request.num_computed_tokens + len(cached_blocks) * self.block_size + num_new_tokens
        new_blocks = [self.pool.take()
                      for _ in range(self.blocks_needed(total) - len(request.block_ids))]
        request.block_ids.extend(new_blocks)
        return new_blocks

    def _shares_partial_block(self, request: Request) -> bool:
        return (request.num_computed_tokens % self.block_size != 0
                and len(request.block_ids) * self.block_size > request.num_computed_tokens
                and self.pool.blocks[request.block_ids[-1]].ref_cnt > 1)

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """This step's copy-on-write copies as (source, destination) pairs."""
        return self.pool.take_pending_copies()

    def fork(self, parent: Request, child: Request) -> None:
        """The child shares the parent's blocks that hold computed tokens (parallel sampling:
        one prefill); a block allocated for the parent's next token stays the parent's."""
        shared = parent.block_ids[:self.blocks_needed(parent.num_computed_tokens)]
        for block_id in shared:
            self.pool.touch(block_id)
        child.block_ids = list(shared)

    def free(self, request: Request) -> None:
        """Release the request's device blocks (a copy still pending into one is dropped)."""
        self.pool.release(request.block_ids)
        request.block_ids = []
        self.prefix_cache.forget(request.request_id)

    def free_tail(self, request: Request, num_tokens: int) -> bool:
        """Release the request's blocks past those its first num_tokens tokens need (blocks
        taken for draft tokens that were rejected); whether any was released."""
        keep = self.blocks_needed(num_tokens)
        if len(request.block_ids) <= keep:
            return False
        self.pool.release(request.block_ids[keep:])
        del request.block_ids[keep:]
        return True

    # ---- swap -----------------------------------------------------------------------

    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Move the request's blocks to the host swap space: (device block, host block)
        pairs, or None when it is too full or a block is still to be loaded from disk (the
        caller falls back to recompute). A block still waiting for its copy-on-write copy
        is read from the copy's source."""
        blocks = request.block_ids
        if (not self.swap_space.can_hold(len(blocks))
                or any(self.disk_connector.loading(b) for b in blocks)):
            return None
        hosts = self.swap_space.take(len(blocks))
        mapping = [(self.pool.source_of(b), host) for b, host in zip(blocks, hosts)]
        request.swap_block_ids = hosts
        self.free(request)
        return mapping

    def swap_in(self, request: Request) -> list[tuple[int, int]]:
        """Bring the request's blocks back: (host block, device block) pairs. The caller
        has checked that enough blocks are free."""
        mapping = [(host, self.pool.take()) for host in request.swap_block_ids]
        request.block_ids = [device for _, device in mapping]
        self.free_swapped(request)
        return mapping

    def free_swapped(self, request: Request) -> None:
        self.swap_space.give_back(request.swap_block_ids)
        request.swap_block_ids = []
