"""KV-cache bookkeeping: a pool of fixed-size blocks, per-request block tables,
reference counts, prefix-cache hashes with lazy LRU eviction, and a host swap pool.

Pure Python: it hands out block ids; the model side owns the tensors they index.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from minivllm.core.request import Request

# A cached block is identified by its parent's hash, its tokens and (first block only)
# the request's cache salt. The key is kept with the block so a hit re-checks the tokens.
BlockKey = tuple[int | None, tuple[int, ...], str | None]


@dataclass
class BlockMeta:
    ref_cnt: int = 0
    key: BlockKey | None = None  # set once the block is full and registered in the cache
    hash: int | None = None


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
        self.blocks = [BlockMeta() for _ in range(num_blocks)]
        # Blocks nobody references, least recently used first. Cached ones stay
        # reusable here until an allocation evicts them.
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.num_swap_blocks = num_swap_blocks
        self.free_swap_blocks: list[int] = list(range(num_swap_blocks - 1, -1, -1))
        self._block_hashes: dict[str, list[int]] = {}  # request id -> hashes of its full blocks
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        # Copy-on-write copies (source block, new block) made by allocations, for the
        # scheduler to hand to the model side.
        self.pending_copies: list[tuple[int, int]] = []

    # ---- capacity -------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix cache ---------------------------------------------------------------

    def _block_key(self, request: Request, index: int, parent_hash: int | None) -> BlockKey:
        start = index * self.block_size
        tokens = tuple(request.all_token_ids[start:start + self.block_size])
        return (parent_hash, tokens, request.cache_salt if index == 0 else None)

    def find_cached_blocks(self, request: Request) -> list[int]:
        """The longest run of cached full blocks matching the request's tokens, capped so
        that at least one token is left to compute. Looks only; takes nothing."""
        if not self.enable_prefix_caching or request.needs_prompt_logits:
            return []
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[int] = []
        parent: int | None = None
        for index in range(max_blocks):
            key = self._block_key(request, index, parent)
            block_id = self.cached.get(hash(key))
            if block_id is None or self.blocks[block_id].key != key:
                break
            hits.append(block_id)
            parent = hash(key)
        return hits

    def record_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache_queries += num_query_tokens
        self.prefix_cache_hits += num_hit_tokens

    def cache_full_blocks(self, request: Request) -> None:
        """Register the request's blocks that are now full of computed tokens."""
        if not self.enable_prefix_caching:
            return
        hashes = self._block_hashes.setdefault(request.request_id, [])
        num_full = min(request.num_computed_tokens // self.block_size, len(request.block_ids))
        for index in range(len(hashes), num_full):
            key = self._block_key(request, index, hashes[-1] if hashes else None)
            block_hash = hash(key)
            hashes.append(block_hash)
            meta = self.blocks[request.block_ids[index]]
            if meta.key is None and block_hash not in self.cached:
                meta.key, meta.hash = key, block_hash
                self.cached[block_hash] = request.block_ids[index]

    # ---- allocation -----------------------------------------------------------------

    def _take_free_block(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        meta = self.blocks[block_id]
        if meta.hash is not None:  # evict from the prefix cache
            del self.cached[meta.hash]
            meta.key = meta.hash = None
        meta.ref_cnt = 1
        return block_id

    def _touch(self, block_id: int) -> None:
        meta = self.blocks[block_id]
        if meta.ref_cnt == 0:
            del self.free_queue[block_id]
        meta.ref_cnt += 1

    def allocate_slots(
        self, request: Request, num_new_tokens: int, cached_blocks: list[int] | None = None
    ) -> list[int] | None:
        """Make room for `num_new_tokens` more computed tokens. `cached_blocks` (prefix hits)
        are appended first. Returns the newly allocated block ids, or None when the pool
        cannot hold them (nothing is changed then; the scheduler preempts)."""
        cached_blocks = cached_blocks or []
        num_cached_tokens = len(cached_blocks) * self.block_size
        total = request.num_computed_tokens + num_cached_tokens + num_new_tokens
        need = max(0, self.blocks_needed(total) - len(request.block_ids) - len(cached_blocks))
        copy_on_write = self._shares_partial_block(request) and num_new_tokens > 0
        reclaimed = sum(1 for b in cached_blocks if self.blocks[b].ref_cnt == 0)
        if need + copy_on_write > self.num_free_blocks - reclaimed:
            return None
        if copy_on_write:  # it will write into a block its siblings still read
            shared = request.block_ids[-1]
            self.blocks[shared].ref_cnt -= 1
            request.block_ids[-1] = self._take_free_block()
            self.pending_copies.append((shared, request.block_ids[-1]))
        for block_id in cached_blocks:
            self._touch(block_id)
        request.block_ids.extend(cached_blocks)
        new_blocks = [self._take_free_block() for _ in range(need)]
        request.block_ids.extend(new_blocks)
        return new_blocks

    def _shares_partial_block(self, request: Request) -> bool:
        return (request.num_computed_tokens % self.block_size != 0
                and len(request.block_ids) * self.block_size > request.num_computed_tokens
                and self.blocks[request.block_ids[-1]].ref_cnt > 1)

    def fork(self, parent: Request, child: Request) -> None:
        """The child shares the parent's blocks that hold computed tokens (parallel sampling:
        one prefill); a block allocated for the parent's next token stays the parent's."""
        shared = parent.block_ids[:self.blocks_needed(parent.num_computed_tokens)]
        for block_id in shared:
            self.blocks[block_id].ref_cnt += 1
        child.block_ids = list(shared)

    def free(self, request: Request) -> None:
        """Release the request's device blocks, tail first, so that the tail of a shared
        prefix is evicted before its head."""
        for block_id in reversed(request.block_ids):
            meta = self.blocks[block_id]
            meta.ref_cnt -= 1
            if meta.ref_cnt == 0:
                self.free_queue[block_id] = None
                if meta.hash is None:  # nothing worth keeping: reuse it first
                    self.free_queue.move_to_end(block_id, last=False)
        request.block_ids = []
        self._block_hashes.pop(request.request_id, None)

    # ---- swap -----------------------------------------------------------------------

    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Move the request's blocks to the host pool: (device block, host block) pairs,
        or None when the host pool is too full (the caller falls back to recompute)."""
        if len(request.block_ids) > len(self.free_swap_blocks):
            return None
        mapping = [(block_id, self.free_swap_blocks.pop()) for block_id in request.block_ids]
        request.swap_block_ids = [host for _, host in mapping]
        self.free(request)
        return mapping

    def swap_in(self, request: Request) -> list[tuple[int, int]] | None:
        """Bring the request's blocks back: (host block, device block) pairs, or None."""
        if len(request.swap_block_ids) > self.num_free_blocks:
            return None
        mapping = [(host, self._take_free_block()) for host in request.swap_block_ids]
        request.block_ids = [device for _, device in mapping]
        self.free_swap_blocks.extend(reversed(request.swap_block_ids))
        request.swap_block_ids = []
        return mapping

    def free_swapped(self, request: Request) -> None:
        self.free_swap_blocks.extend(reversed(request.swap_block_ids))
        request.swap_block_ids = []
