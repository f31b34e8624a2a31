"""Stable keys of prefix-cache blocks, for the disk tier (model/kv_disk.py).

The in-memory prefix cache keys blocks by Python's hash(), which is salted per process
(PYTHONHASHSEED): a restarted engine would never find a block by it. These keys chain the
same things -- the parent block's key, the block's token ids, and on the first block the
cache_salt and the LoRA adapter -- through blake2b, so they are the same in every process.
The adapter is named by its name and path (its lora_int_id is only a handle of this run).
"""

from __future__ import annotations

import hashlib
import struct

from minivllm.core.request import Request

KEY_BYTES = 16


def disk_salt(request: Request) -> bytes:
    """What the first block's key covers beside its tokens."""
    core = request.core_request
    lora = core.lora_request
    parts = (core.cache_salt, lora.lora_name, lora.lora_path) if lora else (core.cache_salt,)
    return repr(parts).encode()


def extend_disk_keys(keys: list[bytes], request: Request, block_size: int) -> list[bytes]:
    """Append to `keys` the stable keys of the request's full blocks it lacks; return it."""
    token_ids = request.all_token_ids
    for index in range(len(keys), len(token_ids) // block_size):
        h = hashlib.blake2b(digest_size=KEY_BYTES)
        h.update(keys[-1] if keys else disk_salt(request))
        block = token_ids[index * block_size:(index + 1) * block_size]
        h.update(struct.pack(f"<{block_size}q", *block))
        keys.append(h.digest())
    return keys
