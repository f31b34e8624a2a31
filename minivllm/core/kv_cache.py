"""KV-cache bookkeeping: a pool of fixed-size blocks, per-request block tables,
reference counts, prefix-cache hashes with lazy LRU eviction, and a host swap pool.

Pure Python: it hands out block ids; the model side owns the tensors they index.

With a disk tier (--kv-offloading-backend disk: model/kv_disk.py, attached by the engine), a
cached block evicted here is written to disk first, and a prefix that misses memory but
hits disk is loaded back into free blocks (load_from_disk) instead of recomputed; a
request's disk blocks are prefetched while it waits (prefetch_from_disk).

Block mappings and the order the model side applies them in (ModelRunner.copy_blocks):
swap-outs, then copy-on-write copies (all at once: every source is read before any
destination is written), then swap-ins. Blocks freed during a step may be handed out again
in the same step, so that order is what keeps each mapping's reads intact:
- a swap-out reads its blocks before anything this step can write them;
- a copy source cannot be overwritten by a swap-in before it is read;
- a copy belongs to the request whose block it fills: when that request is swapped out in
  the same step, its host copy is taken from the copy's source (the destination is not
  filled yet) and the copy is dropped; when the request is freed, the copy is dropped.
The disk tier's transfers go around them: its writes first of all (an evicted block is read
before it is reused), its loads after the swap-outs (a block swapped out, then reused for a
load, is read first) and before the copies and swap-ins (a block loaded, then evicted again
and reused, is written last by its new owner). A request holding a block still to be loaded
is not swapped out (it is recomputed): its host copy would be taken before the load.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from minivllm.core.kv_disk_keys import extend_disk_keys
from minivllm.core.request import Request


def extend_block_hashes(hashes: list[int], token_ids: list[int], block_size: int,
                        cache_salt: str | tuple | None = None) -> list[int]:
    """Append to `hashes` the chained hashes of the full blocks of `token_ids` it lacks, and
    return it: a block's hash covers its parent's hash, its tokens and (first block) the salt
    (EngineCoreRequest.prefix_cache_key: the cache_salt, and the LoRA adapter if any).
    The prefix cache keys blocks by them; the data-parallel router (core/router.py) tracks
    what each replica has cached by the same ones."""
    for index in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[-1] if hashes else None
        block = tuple(token_ids[index * block_size:(index + 1) * block_size])
        hashes.append(hash((parent, block, cache_salt if index == 0 else None)))
    return hashes


@dataclass
class BlockMeta:
    ref_cnt: int = 0
    hash: int | None = None  # set once the block is full and registered in the cache
    parent_hash: int | None = None  # with `tokens`, re-checked on a hit: hashes collide
    tokens: tuple[int, ...] = ()
    disk_key: bytes | None = None  # its stable key (kv_disk_keys.py), with a disk tier


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
        self._num_registered: dict[str, int] = {}  # request id -> its blocks in the cache
        self._verified_hits: dict[str, list[int]] = {}  # request id -> hits checked by token
        # Only an eviction takes a hash out of `cached` (a registration never replaces one):
        # lookups remember the count they saw, and while it stands what they found is still
        # cached, so a waiting request is not re-checked block by block at every step.
        self._num_evictions = 0
        self._verified_at: dict[str, int] = {}  # request id -> _num_evictions at its check
        self._probed: dict[str, tuple[int, int]] = {}  # request id -> (blocks, _num_evictions)
        # Prefix hits are registered blocks, so only _touch and _release (or an eviction)
        # move one into or out of the free queue: the count of those in it is kept for the
        # last hits asked about (the head of the waiting queue, asked again every step).
        self._num_hits_moved = 0
        self._reclaimed: tuple[list[int], int, int, int] = ([], 0, 0, 0)
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        # Copy-on-write copies made by allocations this step, destination -> source.
        self.pending_copies: dict[int, int] = {}
        # The disk tier (model/kv_disk.py's DiskKVStore; None: off), and this step's
        # transfers: evicted blocks to write, (block, key); blocks to load, block -> key.
        self.disk = None
        self.disk_writes: list[tuple[int, bytes]] = []
        self.disk_loads: dict[int, bytes] = {}
        self.disk_hits = 0  # blocks loaded from disk instead of recomputed

    # ---- capacity -------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_blocks_freed_by(self, request: Request, keep: set[int] = frozenset()) -> int:
        """Blocks that would return to the pool if the request let go of its own, not
        counting those in `keep` (prefix hits about to be taken again)."""
        return sum(1 for b in request.block_ids if self.blocks[b].ref_cnt == 1 and b not in keep)

    # ---- prefix cache ---------------------------------------------------------------

    def block_hashes(self, request: Request) -> list[int]:
        """The chained hashes of the request's full blocks, each computed once, as it fills."""
        return extend_block_hashes(request.block_hashes, request.all_token_ids, self.block_size,
                                   request.core_request.prefix_cache_key)

    def _max_hit_blocks(self, request: Request) -> int:
        """A hit leaves at least one token to compute; prompt logprobs need every position."""
        if not self.enable_prefix_caching or request.needs_prompt_logits:
            return 0
        return (request.num_tokens - 1) // self.block_size

    def find_cached_blocks(self, request: Request) -> list[int]:
        """The longest run of cached full blocks matching the request's tokens, re-checked
        token by token. Looks only; takes nothing."""
        hashes, cached = self.block_hashes(request), self.cached
        # A block still registered under the hash it had when its tokens were checked holds
        # the same tokens (only eviction changes them, and it unregisters the block), so a
        # request that waits re-checks token by token only what is new since its last lookup
        # -- or, once an eviction touched its hits, what follows the first one it took.
        verified = self._verified_hits.setdefault(request.request_id, [])
        if self._verified_at.get(request.request_id) != self._num_evictions:
            registered = [cached.get(h) for h in hashes[:len(verified)]]
            if registered != verified:  # keep those before the first one no longer there
                del verified[next(i for i, (old, now) in enumerate(zip(verified, registered))
                                  if old != now):]
        self._verified_at[request.request_id] = self._num_evictions
        for index in range(len(verified), self._max_hit_blocks(request)):
            block_id = cached.get(hashes[index])
            if block_id is None:
                break
            meta, start = self.blocks[block_id], index * self.block_size
            parent = hashes[index - 1] if index else None
            if (meta.parent_hash != parent
                    or meta.tokens != tuple(request.all_token_ids[start:start + self.block_size])):
                break
            verified.append(block_id)
        return list(verified)

    def num_cached_tokens_probe(self, request: Request) -> int:
        """How many tokens the prefix cache would serve, by hashes alone (no token re-check):
        cheap enough for a policy to call on every request at every sort."""
        limit, hashes, cached = self._max_hit_blocks(request), request.block_hashes, self.cached
        if len(hashes) < limit:  # (a waiting request has them all after its first probe)
            hashes = self.block_hashes(request)
        probed = self._probed.get(request.request_id)
        if probed is not None and probed[1] == self._num_evictions:  # those are still cached
            num = probed[0]
            if num < limit and hashes[num] not in cached:  # nothing new: the usual answer
                return num * self.block_size
            num = min(num, limit)
        else:
            num = 0
        while num < limit and hashes[num] in cached:
            num += 1
        self._probed[request.request_id] = (num, self._num_evictions)
        return num * self.block_size

    def record_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache_queries += num_query_tokens
        self.prefix_cache_hits += num_hit_tokens

    def cache_full_blocks(self, request: Request) -> None:
        """Register the request's blocks that are now full of computed tokens."""
        if not self.enable_prefix_caching:
            return
        num_full = min(request.num_computed_tokens // self.block_size, len(request.block_ids))
        done = self._num_registered.get(request.request_id, 0)
        if num_full <= done:
            return
        hashes = self.block_hashes(request)
        keys = self.disk_keys(request) if self.disk is not None else None
        for index in range(done, num_full):
            meta, block_hash = self.blocks[request.block_ids[index]], hashes[index]
            if meta.hash is None and block_hash not in self.cached:
                self._register(request, index, request.block_ids[index],
                               keys[index] if keys else None)
        self._num_registered[request.request_id] = num_full

    def _register(self, request: Request, index: int, block_id: int,
                  disk_key: bytes | None) -> None:
        """Register the block holding the request's index-th full block in the cache."""
        hashes, meta, start = request.block_hashes, self.blocks[block_id], index * self.block_size
        meta.hash, meta.parent_hash = hashes[index], hashes[index - 1] if index else None
        meta.tokens = tuple(request.all_token_ids[start:start + self.block_size])
        meta.disk_key = disk_key
        self.cached[meta.hash] = block_id

    # ---- disk tier ------------------------------------------------------------------

    def disk_keys(self, request: Request) -> list[bytes]:
        """The stable keys of the request's full blocks, each computed once."""
        return extend_disk_keys(request.disk_keys, request, self.block_size)

    def prefetch_from_disk(self, request: Request) -> None:
        """A request starts waiting: the disk tier may read and check, in the background,
        its blocks past those memory holds now (by hashes alone: a hint), so that
        load_from_disk finds them checked when the request is admitted."""
        if self.disk is None or request.num_computed_tokens or not self.enable_prefix_caching:
            return
        limit, hashes = self._max_hit_blocks(request), self.block_hashes(request)
        start = next((i for i in range(limit) if hashes[i] not in self.cached), limit)
        if start < limit:
            self.disk.prefetch(self.disk_keys(request)[start:limit])

    def load_from_disk(self, request: Request, cached: list[int]) -> int:
        """Past its memory hits `cached`, bring the request's next blocks that the disk tier
        holds (checked whole: DiskKVStore.stage) into free blocks, registered in the cache
        like any other (the runner loads their bytes before this step's forward); return how
        many. Each takes the least recently used free block, as an allocation does -- never
        one of `cached`, which move to the recent end first."""
        if self.disk is None or request.num_computed_tokens or not self.enable_prefix_caching:
            return 0
        limit = self._max_hit_blocks(request)
        if len(cached) >= limit:
            return 0
        in_queue = [b for b in cached if self.blocks[b].ref_cnt == 0]
        for block_id in in_queue:
            self.free_queue.move_to_end(block_id)
        room = self.num_free_blocks - len(in_queue)
        keys, hashes = self.disk_keys(request), self.block_hashes(request)
        num = 0
        for index in range(len(cached), min(limit, len(cached) + room)):
            if hashes[index] in self.cached or not self.disk.stage(keys[index]):
                break
            block_id = self._take_free_block()
            self._register(request, index, block_id, keys[index])
            self.blocks[block_id].ref_cnt = 0
            self.free_queue[block_id] = None  # the recent end: a hit about to be taken
            self.disk_loads[block_id] = keys[index]
            num += 1
        self.disk_hits += num
        return num

    def reset_prefix_cache(self, reset_external: bool = False) -> tuple[int, int]:
        """Forget every cached block (POST /reset_prefix_cache): a later prompt misses. The
        free ones become plain free blocks; those running requests hold stay theirs, valid
        and untouched, but no new request shares them any more. With `reset_external`, the
        disk tier's files go too. Between steps only (no transfer is pending then). Returns
        (blocks forgotten, disk blocks deleted)."""
        forgotten = list(self.cached.values())
        for block_id in forgotten:
            meta = self.blocks[block_id]
            meta.hash = meta.parent_hash = meta.disk_key = None
            meta.tokens = ()
            if meta.ref_cnt == 0:  # nothing worth keeping: reuse it first
                self.free_queue.move_to_end(block_id, last=False)
        self.cached.clear()
        # Lookups trust what they found while no eviction happened: this is one, for all.
        self._num_evictions += 1
        deleted = self.disk.clear() if reset_external and self.disk is not None else 0
        return len(forgotten), deleted

    def cached_for_disk(self) -> list[tuple[int, bytes]]:
        """Every block the prefix cache holds, (block, stable key), least recently used
        first: what a stopping engine writes to its disk tier, so that a restart finds the
        prefixes still in memory too (the evicted ones, and the blocks still to be loaded
        from there, are on disk already)."""
        free = [b for b in self.free_queue if self.blocks[b].hash is not None]
        held = [b for b, meta in enumerate(self.blocks)
                if meta.hash is not None and meta.ref_cnt > 0]
        return [(b, self.blocks[b].disk_key) for b in free + held
                if self.blocks[b].disk_key is not None and b not in self.disk_loads]

    def take_disk_transfers(self) -> tuple[list[tuple[int, bytes]], list[tuple[bytes, int]]]:
        """This step's disk writes, (block, key), and loads, (key, block)."""
        writes, loads = self.disk_writes, [(key, b) for b, key in self.disk_loads.items()]
        self.disk_writes, self.disk_loads = [], {}
        return writes, loads

    # ---- allocation -----------------------------------------------------------------

    def _take_free_block(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        meta = self.blocks[block_id]
        if meta.hash is not None:  # evict from the prefix cache
            # to the disk tier first -- unless its bytes are still to be loaded from there
            if self.disk_loads.pop(block_id, None) is None and meta.disk_key is not None:
                self.disk_writes.append((block_id, meta.disk_key))
            del self.cached[meta.hash]
            self._num_evictions += 1
            meta.hash = meta.parent_hash = meta.disk_key = None
            meta.tokens = ()
        meta.ref_cnt = 1
        return block_id

    def _touch(self, block_id: int) -> None:
        meta = self.blocks[block_id]
        if meta.ref_cnt == 0:
            del self.free_queue[block_id]
            self._num_hits_moved += 1
        meta.ref_cnt += 1

    def _num_blocks_to_take(self, request: Request, num_new_tokens: int,
                            cached_blocks: list[int]) -> int:
        total = (request.num_computed_tokens + len(cached_blocks) * self.block_size
                 + num_new_tokens)
        need = max(0, self.blocks_needed(total) - len(request.block_ids) - len(cached_blocks))
        copy_on_write = self._shares_partial_block(request) and num_new_tokens > 0
        return need + copy_on_write + self._num_reclaimed(cached_blocks)

    def _num_reclaimed(self, cached_blocks: list[int]) -> int:
        """Of the prefix hits, those in the free queue: they leave it when touched."""
        hits, evictions, moved, num = self._reclaimed
        if evictions != self._num_evictions or moved != self._num_hits_moved or hits != cached_blocks:
            blocks = self.blocks  # (a list's count: a waiting head's hits run to thousands)
            num = [blocks[b].ref_cnt for b in cached_blocks].count(0)
            self._reclaimed = (list(cached_blocks), self._num_evictions, self._num_hits_moved, num)
        return num

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
            shared = request.block_ids[-1]
            self.blocks[shared].ref_cnt -= 1
            request.block_ids[-1] = self._take_free_block()
            self.pending_copies[request.block_ids[-1]] = shared
        for block_id in cached_blocks:
            self._touch(block_id)
        request.block_ids.extend(cached_blocks)
        total = request.num_computed_tokens + len(cached_blocks) * self.block_size + num_new_tokens
        new_blocks = [self._take_free_block()
                      for _ in range(self.blocks_needed(total) - len(request.block_ids))]
        request.block_ids.extend(new_blocks)
        return new_blocks

    def _shares_partial_block(self, request: Request) -> bool:
        return (request.num_computed_tokens % self.block_size != 0
                and len(request.block_ids) * self.block_size > request.num_computed_tokens
                and self.blocks[request.block_ids[-1]].ref_cnt > 1)

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """This step's copy-on-write copies as (source, destination) pairs."""
        copies = [(src, dst) for dst, src in self.pending_copies.items()]
        self.pending_copies.clear()
        return copies

    def fork(self, parent: Request, child: Request) -> None:
        """The child shares the parent's blocks that hold computed tokens (parallel sampling:
        one prefill); a block allocated for the parent's next token stays the parent's."""
        shared = parent.block_ids[:self.blocks_needed(parent.num_computed_tokens)]
        for block_id in shared:
            self.blocks[block_id].ref_cnt += 1
        child.block_ids = list(shared)

    def free(self, request: Request) -> None:
        """Release the request's device blocks, tail first, so that the tail of a shared
        prefix is evicted before its head. A copy still pending into a released block is
        dropped: nobody will read that block as the request's."""
        self._release(request.block_ids)
        request.block_ids = []
        self._num_registered.pop(request.request_id, None)
        self._verified_hits.pop(request.request_id, None)
        self._verified_at.pop(request.request_id, None)
        self._probed.pop(request.request_id, None)

    def free_tail(self, request: Request, num_tokens: int) -> bool:
        """Release the request's blocks past those its first num_tokens tokens need (blocks
        taken for draft tokens that were rejected); whether any was released."""
        keep = self.blocks_needed(num_tokens)
        if len(request.block_ids) <= keep:
            return False
        self._release(request.block_ids[keep:])
        del request.block_ids[keep:]
        return True

    def _release(self, block_ids: list[int]) -> None:
        """Drop one reference to each block, tail first."""
        for block_id in reversed(block_ids):
            meta = self.blocks[block_id]
            meta.ref_cnt -= 1
            if meta.ref_cnt == 0:
                self.pending_copies.pop(block_id, None)
                self.free_queue[block_id] = None
                self._num_hits_moved += 1
                if meta.hash is None:  # nothing worth keeping: reuse it first
                    self.free_queue.move_to_end(block_id, last=False)

    # ---- swap -----------------------------------------------------------------------

    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Move the request's blocks to the host pool: (device block, host block) pairs,
        or None when the host pool is too full or a block is still to be loaded from disk
        (the caller falls back to recompute). A block still waiting for its copy-on-write
        copy is read from the copy's source."""
        if (len(request.block_ids) > len(self.free_swap_blocks)
                or any(b in self.disk_loads for b in request.block_ids)):
            return None
        mapping = [(self.pending_copies.get(block_id, block_id), self.free_swap_blocks.pop())
                   for block_id in request.block_ids]
        request.swap_block_ids = [host for _, host in mapping]
        self.free(request)
        return mapping

    def swap_in(self, request: Request) -> list[tuple[int, int]]:
        """Bring the request's blocks back: (host block, device block) pairs. The caller
        has checked that enough blocks are free."""
        mapping = [(host, self._take_free_block()) for host in request.swap_block_ids]
        request.block_ids = [device for _, device in mapping]
        self.free_swap_blocks.extend(reversed(request.swap_block_ids))
        request.swap_block_ids = []
        return mapping

    def free_swapped(self, request: Request) -> None:
        self.free_swap_blocks.extend(reversed(request.swap_block_ids))
        request.swap_block_ids = []
