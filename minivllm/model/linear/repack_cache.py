"""GGUF weights as gguf_repacked.c reads them, repacked once and kept in a file in the model's
cache directory (gguf.model_dir: one per GGUF file version), so that a restart maps them
instead of reading and repacking the file's blocks: at 7B, the blocks' copy and the repack
were half of the start and the repacked copy was resident beside the blocks.

    with repack_cache.using(RepackCache(model_dir / RepackCache.file_name())):
        model = build_model(...)   # each GGUFLinear asks `repacked(part, k)`

One file per model and kernel library (the library's name carries its ISA level and a hash of
the kernel sources, so a layout change is a new file): b"MVREPACK", the index's length (u64),
the index (JSON: each tensor's key, offset from the data, bytes and checksum), then the data
from the next page boundary, each tensor at a page boundary. Read, it is memory-mapped copy-on-write (nothing is copied; the kernels only read)
and each tensor's checksum checked (a 64-bit sum of its words: a flipped bit or a torn write
changes it); a file that fails is deleted and the weights repacked. Written once, when a
load repacked anything, to a temporary name renamed into place (a reader never sees half);
writing it deletes the model's files of other libraries.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from minivllm.model.kernels import gguf_ops, library

logger = logging.getLogger(__name__)

MAGIC = b"MVREPACK"
PAGE = 4096

_active: RepackCache | None = None


def checksum(data: torch.Tensor) -> int:
    """A 64-bit sum (wrapping) of the bytes as little-endian words, the tail zero-padded."""
    raw = data.numpy().view(np.uint8)
    words = raw[: raw.size // 8 * 8].view("<u8")
    tail = int.from_bytes(raw[raw.size // 8 * 8:].tobytes().ljust(8, b"\0"), "little")
    return (int(np.add.reduce(words, dtype=np.uint64)) + tail) % (1 << 64)


class RepackCache:
    """The repacked weights of one model for one kernel library: those found in `path`, and
    those repacked since (written by save())."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.found: dict[str, torch.Tensor] = self._read()
        self.added: dict[str, torch.Tensor] = {}
        self.hits = 0

    @staticmethod
    def file_name() -> str:
        lib = library._library()
        return f"repacked-{Path(lib.path).stem}.bin"

    def _read(self) -> dict[str, torch.Tensor]:
        if not self.path.exists():
            return {}
        try:
            with open(self.path, "rb") as f:
                if f.read(len(MAGIC)) != MAGIC:
                    raise ValueError("not a repack cache file")
                (length,) = struct.unpack("<Q", f.read(8))
                index = json.loads(f.read(length))
            mapped = torch.from_numpy(np.memmap(self.path, mode="c"))
            start, tensors = _data_start(length), {}
            for key, (offset, nbytes, expected) in index["tensors"].items():
                tensor = mapped[start + offset:start + offset + nbytes]
                if tensor.numel() != nbytes or checksum(tensor) != expected:
                    raise ValueError(f"tensor {key} fails its checksum")
                tensors[key] = tensor
            return tensors
        except (OSError, ValueError, KeyError, struct.error) as exc:
            logger.warning("repack cache %s is damaged (%s): deleted, repacking", self.path, exc)
            self.path.unlink(missing_ok=True)
            return {}

    def repacked(self, key: str, part, k: int) -> torch.Tensor | None:
        """The weights of `key` (a BlockWeight's) repacked: from the file, else now."""
        size = library._library().gguf_repacked_bytes(qtype=part.qtype, k=k, n=part.shape[0])
        hit = self.found.get(key)
        if hit is not None and hit.numel() == size:
            self.hits += 1
            return hit
        repacked = repack(part, k)
        if repacked is not None:
            self.added[key] = repacked
        return repacked

    def save(self) -> None:
        """Write every tensor (found and added) when any was added."""
        if not self.added:
            return
        tensors = {**self.found, **self.added}
        index, offset = {}, 0
        for key, t in tensors.items():
            index[key] = (offset, t.numel(), checksum(t))
            offset += -(-t.numel() // PAGE) * PAGE
        head = json.dumps({"tensors": index}).encode()
        start = _data_start(len(head))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(temporary, "wb") as f:
                f.write(MAGIC + struct.pack("<Q", len(head)) + head)
                for key, (off, _, _) in index.items():
                    f.seek(start + off)
                    f.write(tensors[key].numpy().tobytes())
            os.replace(temporary, self.path)
        except OSError as exc:  # a read-only or full disk: the next start repacks again
            logger.warning("cannot write the repack cache %s: %s", self.path, exc)
            temporary.unlink(missing_ok=True)
            return
        # one file a model: another library's (an older layout, another ISA level) goes, or
        # every kernel change would leave a model's size behind
        for stale in self.path.parent.glob("repacked-*.bin"):
            if stale != self.path:
                stale.unlink(missing_ok=True)
        logger.info("repack cache: %d tensors (%.0f MiB) written to %s", len(tensors),
                    sum(t.numel() for t in tensors.values()) / (1 << 20), self.path)


def _data_start(index_bytes: int) -> int:
    """Where the data starts: the first page boundary past the magic, length and index."""
    return -(-(len(MAGIC) + 8 + index_bytes) // PAGE) * PAGE


@contextlib.contextmanager
def using(cache: RepackCache | None) -> Iterator[RepackCache | None]:
    """GGUFLinears built inside take their repacked weights from `cache` (None: repack
    each); it is saved on the way out."""
    global _active
    previous, _active = _active, cache
    try:
        yield cache
    finally:
        _active = previous
    if cache is not None:
        if cache.hits:
            logger.info("repack cache: %d tensors mapped from %s", cache.hits, cache.path)
        cache.save()


def repacked(part, k: int) -> torch.Tensor | None:
    """A BlockWeight's weights repacked for gguf_repacked.c (None: a type or K not repacked),
    through the active cache when the blocks come from a file."""
    if _active is None or not part.source:
        return repack(part, k)
    return _active.repacked(f"{part.source}:{part.qtype}:{k}:{part.shape[0]}", part, k)


def repack(part, k: int) -> torch.Tensor | None:
    """gguf_ops.gguf_repack of a BlockWeight; a join of row ranges of whole panels (a fused
    gate/up, q/k/v) repacked range by range into one buffer, never joined as blocks (a 7B's
    gate/up blocks joined were a 0.5 GB copy per layer at load)."""
    ranges = part._parts
    if len(ranges) == 1 or any(r.shape[0] % 16 for r in ranges[:-1]):
        return gguf_ops.gguf_repack(part.blocks, part.qtype, k)
    lib = library._library()
    sizes = [lib.gguf_repacked_bytes(qtype=part.qtype, k=k, n=r.shape[0]) for r in ranges]
    if not all(sizes) or not library.gguf_repacked():
        return None
    out, start = torch.empty(sum(sizes), dtype=torch.uint8), 0
    for blocks, size in zip(ranges, sizes):
        gguf_ops.gguf_repack(blocks, part.qtype, k, out=out[start:start + size])
        start += size
    return out
