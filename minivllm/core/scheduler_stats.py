"""SchedulerStats: the one typed snapshot of a scheduler's queues, KV cache and counters.
Scheduler.stats() makes it; the engine sends it with every step and the stat loggers
(engine/stat_loggers.py) only format it; data-parallel replicas' and the simulator's replicas'
are added up by sum_stats, so a field added here reaches all of them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class SchedulerStats:
    """A snapshot of queues and KV cache after a step. Counters are cumulative."""

    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_total_blocks: int = 0
    num_free_blocks: int = 0
    kv_cache_usage: float = 0.0  # 0-1
    num_total_swap_blocks: int = 0
    num_free_swap_blocks: int = 0
    num_preemptions: int = 0
    num_preemptions_swap: int = 0  # of those, by swap and by recompute
    num_preemptions_recompute: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens served from the cache
    # The prefix cache's disk tier (--kv-offloading-backend disk): of the hits, tokens loaded
    # from disk; its files' bytes read and written; blocks it deleted for room (LRU) and
    # blocks it refused (a failed check: deleted, recomputed).
    kv_disk_hits: int = 0
    kv_disk_bytes_read: int = 0
    kv_disk_bytes_written: int = 0
    kv_disk_evictions: int = 0
    kv_disk_corrupt: int = 0
    # and what it holds now: its block files, their bytes, its capacity (0: no tier)
    kv_disk_blocks: int = 0
    kv_disk_used_bytes: int = 0
    kv_disk_capacity_bytes: int = 0
    # The recompute tax: tokens computed again after recompute preemption, of all computed.
    num_recomputed_tokens: int = 0
    num_computed_tokens: int = 0
    # Deadline policies (edf): requests shed for a missed deadline, and ranked last for it.
    num_requests_shed: int = 0
    num_requests_deprioritized: int = 0
    # Speculative decoding (core/speculative.py's SpecDecodingStats): verifications, draft
    # tokens, accepted ones, and accepted ones by their position in the draft.
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_num_accepted_tokens_per_pos: tuple[int, ...] = ()
    # LoRA: requests by adapter name, running and waiting now, and received (cumulative).
    max_lora: int = 0
    running_lora_adapters: dict[str, int] = field(default_factory=dict)
    waiting_lora_adapters: dict[str, int] = field(default_factory=dict)
    lora_requests_received: dict[str, int] = field(default_factory=dict)

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def recompute_tax(self) -> float:
        """Recomputed tokens as a share of all computed tokens."""
        return self.num_recomputed_tokens / self.num_computed_tokens if self.num_computed_tokens else 0.0


def add_per_position(a: tuple[int, ...], b: tuple[int, ...], sign: int = 1) -> tuple[int, ...]:
    """Per-position counts a + sign * b (the shorter padded with zeros)."""
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return tuple(x + sign * y for x, y in zip(a, b))


def sum_stats(stats: list[SchedulerStats]) -> SchedulerStats:
    """Replicas' snapshots as one: queues and counters add up, KV usage is over all their
    blocks."""
    total = SchedulerStats()
    # Every int field is a queue length, block count or counter: all of them add up, so a
    # counter added to SchedulerStats (the recompute tax's, edf's sheds) is summed too.
    # max_lora is a setting, the same on every replica.
    counts = [f.name for f in fields(SchedulerStats)
              if isinstance(f.default, int) and f.name != "max_lora"]
    for s in stats:
        for name in counts:
            setattr(total, name, getattr(total, name) + getattr(s, name))
        total.spec_num_accepted_tokens_per_pos = add_per_position(
            total.spec_num_accepted_tokens_per_pos, s.spec_num_accepted_tokens_per_pos)
        total.max_lora = max(total.max_lora, s.max_lora)
        for name in ("running_lora_adapters", "waiting_lora_adapters", "lora_requests_received"):
            merged = getattr(total, name)
            for adapter, count in getattr(s, name).items():
                merged[adapter] = merged.get(adapter, 0) + count
    if total.num_total_blocks:
        total.kv_cache_usage = 1.0 - total.num_free_blocks / total.num_total_blocks
    return total
