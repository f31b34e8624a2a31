"""GET /v1/engine/events: the engine, live, as server-sent events (docs/dashboard.md).

EngineEventHub is a stat logger: it sees every step's SchedulerStats and IterationStats as
the stats log line and /metrics do (the same record() calls, hence the same numbers), and,
while at least one client listens, the core's TraceSamples (request lifecycles, the block
map). Under data parallel each replica reports its own: a snapshot shows their sum (queues,
KV cache, throughput) and their block maps side by side, and the lifecycle events of all.
The first client turns the cores' tracing on, the last one to leave turns it off: with
nobody listening the engine does no work for the dashboard beyond a few additions per step.

Each client gets, in order: one `config` event; then per interval one `snapshot` (queues,
KV cache and its disk tier, throughput, the steps' token budget use, where the streams' TTFT
went) and, when requests changed state, one `lifecycle` event with those changes. A client
too slow to take them is dropped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import AsyncIterator

from minivllm.core.lifecycle import TraceSample
from minivllm.core.scheduler_stats import SchedulerStats, sum_stats
from minivllm.engine.stat_loggers import StatLoggerBase
from minivllm.engine.stats import IterationStats
from minivllm.entrypoints.openai.request_timing import PARTS as TTFT_PARTS

_MAX_QUEUED_EVENTS = 64  # per client; more means it stopped reading


class EventStream:
    """One client's queue of encoded SSE events."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(_MAX_QUEUED_EVENTS)

    def put(self, event: bytes) -> None:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:  # it stopped reading: end its stream
            self.close()

    def close(self) -> None:
        while True:  # make room for the end marker
            try:
                self.queue.put_nowait(None)
                return
            except asyncio.QueueFull:
                self.queue.get_nowait()


def sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class EngineEventHub(StatLoggerBase):
    """record() / record_trace() come from AsyncLLM's output task; take() from the
    broadcast task or a test's thread: what they touch is under a lock."""

    def __init__(self, engine, config: dict, interval: float = 1.0) -> None:
        self.engine = engine
        self.config = config  # the `config` event: model, policy, engine settings
        self.interval = interval
        self.streams: set[EventStream] = set()
        self._task: asyncio.Task | None = None
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        with self._lock:
            self._stats: dict[int, SchedulerStats] = {}  # each engine's last, by engine_idx
            self._prompt_tokens = self._generation_tokens = 0
            self._events: list[dict] = []
            self._steps = self._step_tokens = self._max_step_tokens = 0
            self._token_budget = 0
            self._block_maps: dict[int, dict] = {}
            self._ranks: dict[int, dict[str, int]] = {}
            self._ttft_parts: dict[str, float] = {}  # sums over the interval's streams
            self._ttft_count = 0
            self._since = time.monotonic()

    # ---- the stat logger side ---------------------------------------------------------

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats,
               engine_idx: int = 0) -> None:
        if not self.streams:
            return
        with self._lock:
            self._stats[engine_idx] = scheduler_stats
            self._prompt_tokens += iteration_stats.num_prompt_tokens
            self._generation_tokens += iteration_stats.num_generation_tokens

    def record_trace(self, sample: TraceSample, engine_idx: int = 0) -> None:
        with self._lock:
            self._events += [_event_dict(e) for e in sample.events]
            self._steps += sample.num_steps
            self._step_tokens += sample.scheduled_tokens
            self._max_step_tokens = max(self._max_step_tokens, sample.max_step_tokens)
            self._token_budget = sample.token_budget
            if sample.block_map is not None:
                self._block_maps[engine_idx] = sample.block_map
            self._ranks[engine_idx] = sample.ranks

    def record_ttft_parts(self, parts: dict) -> None:
        """A stream's first token was sent: where its TTFT went (request_timing.py)."""
        if not self.streams:
            return
        with self._lock:
            for key in TTFT_PARTS:
                self._ttft_parts[key] = self._ttft_parts.get(key, 0.0) + parts[key]
            self._ttft_count += 1

    # ---- clients ----------------------------------------------------------------------

    async def stream(self) -> AsyncIterator[bytes]:
        """One client's events until it leaves (the server cancels this generator then)."""
        stream = EventStream()
        self._join(stream)
        try:
            yield sse("config", {**self.config, "interval": self.interval})
            while (event := await stream.queue.get()) is not None:
                yield event
        finally:
            self._leave(stream)

    def _join(self, stream: EventStream) -> None:
        if not self.streams:
            self._reset()
            # The core samples twice per interval: every snapshot has a fresh block map.
            self.engine.set_tracing(True, self.interval / 2)
            self._task = asyncio.get_running_loop().create_task(self._broadcast())
        self.streams.add(stream)

    def _leave(self, stream: EventStream) -> None:
        self.streams.discard(stream)
        if not self.streams and self._task is not None:
            self._task.cancel()
            self._task = None
            self.engine.set_tracing(False, self.interval)
            self._reset()  # drop the history, the block map: nobody will read them

    async def _broadcast(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            events, snapshot = self.take()
            encoded = [sse("snapshot", snapshot)]
            if events:
                encoded.append(sse("lifecycle", {"events": events}))
            for stream in list(self.streams):
                for event in encoded:
                    stream.put(event)

    def take(self) -> tuple[list[dict], dict]:
        """The lifecycle events since the last take, and the snapshot now."""
        with self._lock:
            now = time.monotonic()
            elapsed = max(now - self._since, 1e-9)
            s = _merged_stats(self._stats)
            used_swap = s.num_total_swap_blocks - s.num_free_swap_blocks
            snapshot = {
                "t": time.time(),
                "running": s.num_running, "waiting": s.num_waiting, "swapped": s.num_swapped,
                "preemptions": s.num_preemptions,
                "kv_cache_usage": s.kv_cache_usage,
                "cpu_cache_usage": used_swap / s.num_total_swap_blocks
                if s.num_total_swap_blocks else 0.0,
                "prefix_cache_hit_rate": s.prefix_cache_hit_rate,
                "prefix_cache_queries": s.prefix_cache_queries,
                "prefix_cache_hits": s.prefix_cache_hits,
                "kv_disk": _disk_tier(s),
                # The stats log line's figures: tokens the steps counted, over the interval.
                "prompt_throughput": self._prompt_tokens / elapsed,
                "generation_throughput": self._generation_tokens / elapsed,
                "steps": {"count": self._steps, "token_budget": self._token_budget,
                          "mean_tokens": self._step_tokens / self._steps if self._steps else 0,
                          "max_tokens": self._max_step_tokens},
                "block_map": _merged_block_map(self._block_maps),
                "ranks": {rid: rank for ranks in self._ranks.values()
                          for rid, rank in ranks.items()},
                # the mean TTFT parts (ms) of the streams whose first token went out since
                "ttft_split": {"requests": self._ttft_count,
                               **{key.removesuffix("_s") + "_ms":
                                  self._ttft_parts[key] / self._ttft_count * 1000
                                  for key in TTFT_PARTS}} if self._ttft_count else None,
            }
            events, self._events = self._events, []
            self._prompt_tokens = self._generation_tokens = 0
            self._steps = self._step_tokens = self._max_step_tokens = 0
            self._ttft_parts, self._ttft_count = {}, 0
            self._since = now
        return events, snapshot


def _merged_stats(stats: dict[int, SchedulerStats]) -> SchedulerStats:
    """One engine's stats as they are; replicas' added up (queues, counters, blocks)."""
    if len(stats) <= 1:
        return next(iter(stats.values()), SchedulerStats())
    return sum_stats([stats[i] for i in sorted(stats)])


def _disk_tier(s: SchedulerStats) -> dict | None:
    """The prefix cache's disk tier now (counters cumulative); None when there is none."""
    if not s.kv_disk_capacity_bytes:
        return None
    return {"used_bytes": s.kv_disk_used_bytes, "capacity_bytes": s.kv_disk_capacity_bytes,
            "blocks": s.kv_disk_blocks, "hit_tokens": s.kv_disk_hits,
            "bytes_read": s.kv_disk_bytes_read, "bytes_written": s.kv_disk_bytes_written,
            "evictions": s.kv_disk_evictions, "corrupt": s.kv_disk_corrupt}


def _merged_block_map(maps: dict[int, dict]) -> dict | None:
    """One engine's block map as it is; replicas' counts added up and their cells side by
    side, in replica order (the same model and settings: the same blocks per cell)."""
    if len(maps) <= 1:
        return next(iter(maps.values()), None)
    ordered = [maps[i] for i in sorted(maps)]
    merged = {key: sum(m[key] for m in ordered) for key in
              ("total", "in_use", "cached", "free", "swap_total", "swapped")}
    for key in ("cells", "swap_cells"):
        merged[key] = {"per_cell": ordered[0][key]["per_cell"],
                       "map": "".join(m[key]["map"] for m in ordered)}
    return merged


def _event_dict(event) -> dict:
    """A LifecycleEvent without its empty fields."""
    return {k: v for k, v in dataclasses.asdict(event).items()
            if v is not None and not (k == "tokens" and v == 0)}
