"""The KV manager's connector to the prefix cache's disk tier (--kv-offloading-backend disk:
the store is model/kv_disk.py's DiskKVStore, or the simulator's sim/disk_tier.py, attached by
whoever owns it). It collects the step's transfers the runner carries out: blocks evicted
from memory to write to disk, and disk hits to load into free blocks. Writes enter only at
an eviction, loads only at an admission's lookup, so one rule settles both at one place: a
block evicted while still to be loaded is neither loaded nor written (its bytes are on disk
already)."""

from __future__ import annotations

from minivllm.core.kv_disk_keys import extend_disk_keys
from minivllm.core.request import Request


class DiskConnector:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.store = None  # the disk tier (stage, prefetch, clear and its counters); None: off
        # --kv-transfer-config's roles: a producer writes every block it fills at once
        # (`write_through`), a consumer keeps its evicted blocks out of the shared folder
        # and a producer alone loads nothing from it
        self.write_through, self.write_evicted, self.loads = False, True, True
        self._writes: list[tuple[int, bytes]] = []  # (block, key), in eviction order
        self._loads: dict[int, bytes] = {}  # block -> key
        self.hits = 0  # blocks loaded from disk instead of recomputed

    def keys(self, request: Request) -> list[bytes]:
        """The stable keys of the request's full blocks, each computed once."""
        return extend_disk_keys(request.disk_keys, request, self.block_size)

    def keys_if_on(self, request: Request) -> list[bytes] | None:
        return self.keys(request) if self.store is not None else None

    def evicted(self, block_id: int, key: bytes | None) -> None:
        """A cached block is being reused: its bytes go to disk first -- unless they are
        still to be loaded from there."""
        if self._loads.pop(block_id, None) is None and key is not None and self.write_evicted:
            self._writes.append((block_id, key))

    def filled(self, blocks: list[tuple[int, bytes | None]]) -> None:
        """Blocks the prefix cache registered as full of computed tokens: written at once
        by a producer."""
        if self.write_through and self.store is not None:
            self._writes += [(block_id, key) for block_id, key in blocks if key is not None]

    def take_writes(self) -> list[tuple[int, bytes]]:
        writes, self._writes = self._writes, []
        return writes

    def load(self, block_id: int, key: bytes) -> None:
        """The block's bytes come from disk before this step's forward."""
        self._loads[block_id] = key
        self.hits += 1

    def loading(self, block_id: int) -> bool:
        """Whether the block's bytes are still to be loaded (this step)."""
        return block_id in self._loads

    def take_transfers(self) -> tuple[list[tuple[int, bytes]], list[tuple[bytes, int]]]:
        """This step's disk writes, (block, key), and loads, (key, block)."""
        writes, loads = self._writes, [(key, b) for b, key in self._loads.items()]
        self._writes, self._loads = [], {}
        return writes, loads

    def stats(self) -> dict[str, int]:
        """The disk tier's SchedulerStats fields (zeros without one)."""
        disk = self.store
        return {"kv_disk_hits": self.hits * self.block_size,
                "kv_disk_bytes_read": disk.bytes_read if disk else 0,
                "kv_disk_bytes_written": disk.bytes_written if disk else 0,
                "kv_disk_evictions": disk.evictions if disk else 0,
                "kv_disk_corrupt": disk.corrupt if disk else 0,
                "kv_disk_blocks": len(disk.index) if disk else 0,
                "kv_disk_used_bytes": disk.used if disk else 0,
                "kv_disk_capacity_bytes": disk.capacity if disk else 0}
