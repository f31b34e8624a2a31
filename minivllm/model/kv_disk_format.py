"""The disk tier's block file (model/kv_disk.py): a magic, a JSON header, the payload.

The header names the identity the bytes depend on (the model, dtypes, shapes, format
version: DiskKVStore's), the block's key, the payload's length and its blake2b checksum;
`decode` refuses a file unless all of them match, so a copied, torn or flipped file is
never read as KV.
"""

from __future__ import annotations

import hashlib
import json
import struct

# Memory the store's background I/O may hold beside the cache (model/kv_disk.py; the
# simulator's tier models the same queue): blocks copied out and waiting for the writer
# (when full, the step waits for it), and blocks prefetched and not yet staged.
WRITE_QUEUE_BYTES = 64 << 20
PREFETCH_BYTES = 256 << 20
FORMAT_VERSION = 2  # 2: an int8 cache's keys are stored smoothed (key_smoothing.py)
MAGIC = b"MVKVBLK1"
_HEAD = struct.Struct("<8sI")  # magic, header length; then the JSON header, the payload
_DIGEST_BYTES = 16


def _header(identity: dict, key: bytes, num_bytes: int, digest: str) -> bytes:
    return json.dumps({"identity": identity, "key": key.hex(), "bytes": num_bytes,
                       "blake2b": digest}).encode()


def file_size(identity: dict, key: bytes, num_bytes: int) -> int:
    """The size of a block's file before its checksum is computed: the checksum is written
    as fixed-length hex, so a placeholder of that length gives the header's length."""
    return _HEAD.size + len(_header(identity, key, num_bytes, "0" * 2 * _DIGEST_BYTES)) + num_bytes


def encode(identity: dict, key: bytes, payload: bytearray) -> bytes:
    """The file's bytes: checksums the payload (the costly part, on the writer thread)."""
    digest = hashlib.blake2b(payload, digest_size=_DIGEST_BYTES).hexdigest()
    header = _header(identity, key, len(payload), digest)
    return _HEAD.pack(MAGIC, len(header)) + header + payload


def decode(data: bytes, identity: dict, key: bytes) -> bytearray | None:
    """The payload of a file's bytes, or None unless its magic, identity, key, length and
    checksum all match."""
    try:
        magic, header_len = _HEAD.unpack_from(data)
        header = json.loads(data[_HEAD.size:_HEAD.size + header_len])
    except (struct.error, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    payload = bytearray(data[_HEAD.size + header_len:])
    if (magic != MAGIC or header.get("identity") != identity
            or header.get("key") != key.hex() or header.get("bytes") != len(payload)
            or header.get("blake2b") != hashlib.blake2b(
                payload, digest_size=_DIGEST_BYTES).hexdigest()):
        return None
    return payload
