"""The prefix-cache index: full blocks of computed tokens registered under the chained hash
of their tokens, so that a later request with the same prefix takes them instead of
computing them again. It only indexes blocks: which one is evicted when is the pool's
decision (core/block_pool.py takes the least recently used free block, and calls evict)."""

from __future__ import annotations

from collections.abc import Callable

from minivllm.core.block_pool import BlockMeta
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


class PrefixCache:
    def __init__(self, blocks: list[BlockMeta], block_size: int, enabled: bool,
                 disk_keys: Callable[[Request], list[bytes] | None]) -> None:
        """`blocks`: the pool's; registering a block sets its hash, parent and tokens.
        `disk_keys(request)`: its blocks' stable keys, None without a disk tier."""
        self.blocks = blocks
        self.block_size = block_size
        self.enabled = enabled
        self._disk_keys = disk_keys
        self.cached: dict[int, int] = {}  # block hash -> block id
        self._num_registered: dict[str, int] = {}  # request id -> its blocks in the cache
        self._verified_hits: dict[str, list[int]] = {}  # request id -> hits checked by token
        # Only an eviction takes a hash out of `cached` (a registration never replaces one):
        # lookups remember the count they saw, and while it stands what they found is still
        # cached, so a waiting request is not re-checked block by block at every step.
        self.num_evictions = 0
        self._verified_at: dict[str, int] = {}  # request id -> num_evictions at its check
        self._probed: dict[str, tuple[int, int]] = {}  # request id -> (blocks, num_evictions)
        self.queries = 0  # prompt tokens looked up
        self.hits = 0  # of those, tokens served from the cache

    def block_hashes(self, request: Request) -> list[int]:
        """The chained hashes of the request's full blocks, each computed once, as it fills."""
        return extend_block_hashes(request.block_hashes, request.all_token_ids, self.block_size,
                                   request.core_request.prefix_cache_key)

    def max_hit_blocks(self, request: Request) -> int:
        """A hit leaves at least one token to compute; prompt logprobs need every position."""
        if not self.enabled or request.needs_prompt_logits:
            return 0
        return (request.num_tokens - 1) // self.block_size

    def find(self, request: Request) -> list[int]:
        """The longest run of cached full blocks matching the request's tokens, re-checked
        token by token. Looks only; takes nothing."""
        hashes, cached = self.block_hashes(request), self.cached
        # A block still registered under the hash it had when its tokens were checked holds
        # the same tokens (only eviction changes them, and it unregisters the block), so a
        # request that waits re-checks token by token only what is new since its last lookup
        # -- or, once an eviction touched its hits, what follows the first one it took.
        verified = self._verified_hits.setdefault(request.request_id, [])
        if self._verified_at.get(request.request_id) != self.num_evictions:
            registered = [cached.get(h) for h in hashes[:len(verified)]]
            if registered != verified:  # keep those before the first one no longer there
                del verified[next(i for i, (old, now) in enumerate(zip(verified, registered))
                                  if old != now):]
        self._verified_at[request.request_id] = self.num_evictions
        for index in range(len(verified), self.max_hit_blocks(request)):
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

    def probe(self, request: Request) -> int:
        """How many tokens the cache would serve, by hashes alone (no token re-check):
        cheap enough for a policy to call on every request at every sort."""
        limit, hashes, cached = self.max_hit_blocks(request), request.block_hashes, self.cached
        if len(hashes) < limit:  # (a waiting request has them all after its first probe)
            hashes = self.block_hashes(request)
        probed = self._probed.get(request.request_id)
        if probed is not None and probed[1] == self.num_evictions:  # those are still cached
            num = probed[0]
            if num < limit and hashes[num] not in cached:  # nothing new: the usual answer
                return num * self.block_size
            num = min(num, limit)
        else:
            num = 0
        while num < limit and hashes[num] in cached:
            num += 1
        self._probed[request.request_id] = (num, self.num_evictions)
        return num * self.block_size

    def num_in_memory(self, request: Request) -> int:
        """How many of the request's leading blocks that a hit may cover are cached, by
        hashes alone."""
        limit, hashes = self.max_hit_blocks(request), self.block_hashes(request)
        return next((i for i in range(limit) if hashes[i] not in self.cached), limit)

    def record_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.queries += num_query_tokens
        self.hits += num_hit_tokens

    def register_full_blocks(self, request: Request) -> list[tuple[int, bytes | None]]:
        """Register the request's blocks that are now full of computed tokens (a block whose
        hash another block holds already stays unregistered); those registered, (block,
        disk key)."""
        if not self.enabled:
            return []
        num_full = min(request.num_computed_tokens // self.block_size, len(request.block_ids))
        done = self._num_registered.get(request.request_id, 0)
        if num_full <= done:
            return []
        hashes = self.block_hashes(request)
        keys = self._disk_keys(request)
        registered = []
        for index in range(done, num_full):
            block_id, block_hash = request.block_ids[index], hashes[index]
            if self.blocks[block_id].hash is None and block_hash not in self.cached:
                key = keys[index] if keys else None
                self.register(request, index, block_id, key)
                registered.append((block_id, key))
        self._num_registered[request.request_id] = num_full
        return registered

    def register(self, request: Request, index: int, block_id: int,
                 disk_key: bytes | None) -> None:
        """Register `block_id` as holding the request's index-th full block."""
        hashes, meta, start = request.block_hashes, self.blocks[block_id], index * self.block_size
        meta.hash, meta.parent_hash = hashes[index], hashes[index - 1] if index else None
        meta.tokens = tuple(request.all_token_ids[start:start + self.block_size])
        meta.disk_key = disk_key
        self.cached[meta.hash] = block_id

    def evict(self, block_id: int) -> bytes | None:
        """Unregister the block (the pool is taking it for reuse); its disk key, if any."""
        meta = self.blocks[block_id]
        disk_key = meta.disk_key
        del self.cached[meta.hash]
        self.num_evictions += 1
        self._unregister(meta)
        return disk_key

    def reset(self) -> list[int]:
        """Unregister every block; which they were."""
        forgotten = list(self.cached.values())
        for block_id in forgotten:
            self._unregister(self.blocks[block_id])
        self.cached.clear()
        # Lookups trust what they found while no eviction happened: this is one, for all.
        self.num_evictions += 1
        return forgotten

    def forget(self, request_id: str) -> None:
        """The request let go of its blocks: what was remembered of its lookups goes too."""
        self._num_registered.pop(request_id, None)
        self._verified_hits.pop(request_id, None)
        self._verified_at.pop(request_id, None)
        self._probed.pop(request_id, None)

    @staticmethod
    def _unregister(meta: BlockMeta) -> None:
        meta.hash = meta.parent_hash = meta.disk_key = None
        meta.tokens = ()
