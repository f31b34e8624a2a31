"""The simulator's KV transfer from a prefill replica to a decode replica (prefill/decode
disaggregation, sim/disaggregated.py): the link the blocks cross, and the decode replica's
receive buffer.

A link carries one transfer at a time (a later one queues behind it): a transfer of B bytes
handed over at t arrives at max(t, when the link is free) + B / bandwidth + latency. The
receive buffer is a disk tier (sim/disk_tier.py) that only receives: the decode replica's KV
manager finds a request's transferred blocks there by their stable keys when it admits the
request -- a prefix hit, as a block on disk is -- and loads them into its cache (the cost
model prices that copy at the link's rate); its own evicted blocks go nowhere. A block the
buffer dropped before its request was admitted (a buffer full of transfers) is recomputed
there, never lost."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.sim.disk_tier import SimDiskTier

# bytes/s where nothing measured the link: our assumption, the order of a PCIe 4.0 x16 link
# or of one CPU host's memory copy (--kv-transfer-gbps sets it)
DEFAULT_KV_TRANSFER_BANDWIDTH = 25e9


@dataclass
class KVLink:
    bandwidth: float  # bytes/s
    latency_s: float = 0.0
    free_at: float = 0.0  # when the transfer on it now ends
    bytes_sent: int = 0
    transfers: int = 0
    busy_s: float = 0.0  # seconds it carried bytes
    queued_s: float = 0.0  # seconds transfers waited for it

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ValueError(f"a KV link needs a bandwidth > 0 bytes/s, got {self.bandwidth}")
        if not self.latency_s >= 0:
            raise ValueError(f"a KV link's latency must be >= 0 s, got {self.latency_s}")

    def send(self, now: float, num_bytes: int) -> float:
        """When `num_bytes` handed over at `now` have arrived."""
        start = max(now, self.free_at)
        seconds = num_bytes / self.bandwidth
        self.free_at = start + seconds
        self.bytes_sent += num_bytes
        self.transfers += 1
        self.busy_s += seconds
        self.queued_s += start - now
        return self.free_at + self.latency_s


class ReceiveBuffer(SimDiskTier):
    """A decode replica's transferred blocks, found and loaded through its KV manager's
    disk-tier connector; least recently received dropped beyond its capacity."""

    def receive(self, keys: list[bytes]) -> None:
        super().write([(-1, key) for key in keys])

    def write(self, blocks: list[tuple[int, bytes]]) -> int:
        """The decode replica's own evicted blocks: not kept (no disk tier behind it)."""
        return 0
