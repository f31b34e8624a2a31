"""The disk tier of the prefix cache (--kv-offloading-backend disk): blocks the prefix cache
evicts from memory are written here, and loaded back when a prompt misses memory but hits
here (core/kv_cache.py decides which; this module moves the bytes).

One file per block, named by its stable key (core/kv_disk_keys.py), in a folder per
identity under --kv-offloading-path: the model (its path, config and weight files' sizes
and mtimes), the activation and KV dtypes, the quantization, the block size, the shapes of
the tensors of a block and the format version. Another model, dtype or format looks in
another folder; the header repeats the identity and the key, and a checksum covers the
payload, so a file copied, torn or flipped is refused (and deleted), never read as KV.
Files are written to a temporary name, then renamed into place (atomic). A restarted engine
rebuilds its index by scanning its folder, least recently used first by mtime.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from collections import OrderedDict
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: an int8 cache's keys are stored smoothed (key_smoothing.py)
MAGIC = b"MVKVBLK1"
_HEAD = struct.Struct("<8sI")  # magic, header length; then the JSON header, the payload
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


class DiskKVStore:
    def __init__(self, root: str, capacity_bytes: int, identity: dict,
                 tensors: tuple[torch.Tensor, ...]) -> None:
        """`identity`: what a block's bytes depend on beside its key (see the module's
        docstring); `tensors`: the cache tensors of every layer, [layers, blocks, ...] each
        (model/kv_quant.py's tensors(): a quantized cache's scales too)."""
        self.capacity = capacity_bytes
        self.tensors = tensors
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
        self.index: OrderedDict[bytes, int] = OrderedDict()  # key -> file bytes, LRU first
        self.used = 0
        self._staged: dict[bytes, bytearray] = {}  # checked payloads for this step's loads
        self.bytes_read = self.bytes_written = self.evictions = self.corrupt = 0
        self._scan()

    # ---- the index ------------------------------------------------------------------

    def _scan(self) -> None:
        """Index the files a previous run left, oldest first; leftover temporary files
        (a write cut short) are deleted. Headers are checked when a block is loaded."""
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
        for _, key, size in sorted(entries):
            self.index[key] = size
            self.used += size
        self._evict_to(self.capacity)
        if self.index:
            logger.info("KV disk tier %s: %d blocks (%.1f MiB) from a previous run",
                        self.dir, len(self.index), self.used / (1 << 20))

    def _path(self, key: bytes) -> Path:
        return self.dir / f"{key.hex()}.kv"

    def _drop(self, key: bytes) -> None:
        self.used -= self.index.pop(key)
        self._path(key).unlink(missing_ok=True)

    def _evict_to(self, limit: int) -> None:
        while self.index and self.used > limit:
            self._drop(next(iter(self.index)))
            self.evictions += 1

    # ---- what the KV manager asks ---------------------------------------------------

    def stage(self, key: bytes) -> bool:
        """Whether the block is here and whole: its file is read and checked now (header,
        length, checksum), and kept for this step's load. A bad file is deleted."""
        if key in self._staged:
            return True
        if key not in self.index:
            return False
        payload = self._read(key)
        if payload is None:
            self.corrupt += 1
            logger.warning("KV disk tier: %s failed its check; deleted (recomputed)",
                           self._path(key).name)
            self._drop(key)
            return False
        self.index.move_to_end(key)
        os.utime(self._path(key))  # the LRU order a restart rebuilds
        self._staged[key] = payload
        return True

    def _read(self, key: bytes) -> bytearray | None:
        try:
            data = self._path(key).read_bytes()
            magic, header_len = _HEAD.unpack_from(data)
            header = json.loads(data[_HEAD.size:_HEAD.size + header_len])
        except (OSError, struct.error, ValueError):
            return None
        payload = bytearray(data[_HEAD.size + header_len:])
        if (magic != MAGIC or header.get("identity") != self.identity
                or header.get("key") != key.hex() or header.get("bytes") != len(payload)
                or header.get("blake2b") != hashlib.blake2b(payload, digest_size=16).hexdigest()):
            return None
        self.bytes_read += len(data)
        return payload

    def clear(self) -> int:
        """Delete every block file and the index (POST /reset_prefix_cache?reset_external=
        true); how many blocks were deleted. The counters stay: they are cumulative."""
        num = len(self.index)
        for key in list(self.index):
            self._drop(key)
        self._staged.clear()
        return num

    # ---- what the runner does -------------------------------------------------------

    def write(self, blocks: list[tuple[int, bytes]]) -> None:
        """Write evicted blocks (block id, key) not here yet, before they are reused."""
        for block_id, key in blocks:
            if key in self.index:
                self.index.move_to_end(key)
                continue
            payload = b"".join(t[:, block_id].contiguous().view(torch.uint8).cpu().numpy()
                               .tobytes() for t in self.tensors)
            header = json.dumps({"identity": self.identity, "key": key.hex(),
                                 "bytes": len(payload),
                                 "blake2b": hashlib.blake2b(payload, digest_size=16)
                                 .hexdigest()}).encode()
            data = _HEAD.pack(MAGIC, len(header)) + header + payload
            if len(data) > self.capacity:
                continue  # the tier is too small to hold a block
            self._evict_to(self.capacity - len(data))
            path, tmp = self._path(key), self.dir / f"{key.hex()}.{os.getpid()}.tmp"
            try:
                tmp.write_bytes(data)
                os.replace(tmp, path)
            except OSError as e:  # a full or failing disk costs recomputes, not the engine
                logger.warning("KV disk tier: cannot write %s: %s", path, e)
                tmp.unlink(missing_ok=True)
                continue
            self.index[key] = len(data)
            self.used += len(data)
            self.bytes_written += len(data)

    def load(self, blocks: list[tuple[bytes, int]]) -> None:
        """Fill blocks (key, block id) from their staged payloads, then drop the rest (a
        load dropped because its block was evicted again in the step)."""
        for key, block_id in blocks:
            payload, offset = self._staged.pop(key), 0
            for t in self.tensors:
                dst = t[:, block_id]
                size = dst.numel() * dst.element_size()
                src = torch.frombuffer(payload, dtype=torch.uint8, count=size, offset=offset)
                dst.copy_(src.view(t.dtype).view(dst.shape))
                offset += size
        self._staged.clear()
