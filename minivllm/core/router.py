"""The data-parallel router: which engine replica serves a request (`--router-policy`).

A policy picks a replica from those that are up, given what the router knows of each:
its load, as the replica last reported it (requests running and waiting, KV cache usage)
plus the requests routed to it since that report, and the prefixes it has served, as the
chained block hashes the KV manager keys its prefix cache by (prefix_cache.extend_block_hashes).
Adding a policy is one class and one `@register` line.

- round_robin: each replica in turn.
- least_load: the fewest requests (running + waiting + routed since the last report), then
  the lowest KV cache usage.
- cache_aware (default): the replica that served the longest prefix of this prompt, unless
  its load exceeds the least-loaded replica's by more than `balance_threshold` requests;
  with no prefix anywhere, least_load.

Sticky sessions (optional, any policy): a `user` goes back to the replica it was routed to
last, while that replica is up and within the balance threshold.

Pure Python, no torch: the simulator routes with it too.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass

from minivllm.core.prefix_cache import extend_block_hashes

ROUTER_POLICIES: dict[str, type[RouterPolicy]] = {}
DEFAULT_ROUTER_POLICY = "cache_aware"
DEFAULT_BALANCE_THRESHOLD = 8  # requests
# Prefix blocks remembered per replica when its KV capacity is not given.
DEFAULT_CACHE_CAPACITY_BLOCKS = 1 << 16


def register(name: str):
    def wrap(cls: type[RouterPolicy]) -> type[RouterPolicy]:
        cls.name = name
        ROUTER_POLICIES[name] = cls
        return cls

    return wrap


@dataclass
class ReplicaState:
    """What the router knows of one replica."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    routed_since_report: int = 0  # not in the replica's last report yet
    available: bool = True

    @property
    def load(self) -> int:
        return self.num_running + self.num_waiting + self.routed_since_report


class PrefixIndex:
    """The block hashes of the prefixes one replica has served, least recently used first,
    at most `capacity` of them (the replica's KV blocks: beyond that its cache has evicted)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def match(self, hashes: list[int]) -> int:
        """How many leading blocks of `hashes` this replica has served."""
        num = 0
        for h in hashes:
            if h not in self._blocks:
                break
            num += 1
        return num

    def insert(self, hashes: list[int]) -> None:
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()


@dataclass
class RouteDecision:
    replica: int
    prefix_hit_blocks: int  # blocks of the prompt the chosen replica has served before
    prefix_hit_tokens: int


class RouterPolicy(ABC):
    name = "abstract"

    def __init__(self, num_replicas: int, block_size: int, *,
                 balance_threshold: int = DEFAULT_BALANCE_THRESHOLD,
                 sticky_sessions: bool = False,
                 cache_capacity_blocks: int | None = None) -> None:
        if num_replicas < 1:
            raise ValueError(f"the router needs at least one replica, got {num_replicas}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_replicas, self.block_size = num_replicas, block_size
        self.balance_threshold = balance_threshold
        self.sticky_sessions = sticky_sessions
        self.replicas = [ReplicaState() for _ in range(num_replicas)]
        capacity = cache_capacity_blocks or DEFAULT_CACHE_CAPACITY_BLOCKS
        self.prefixes = [PrefixIndex(capacity) for _ in range(num_replicas)]
        self._sessions: dict[str, int] = {}  # user -> replica (sticky sessions)
        self.num_routed = [0] * num_replicas

    # ---- what the replicas tell -----------------------------------------------------------

    def update_stats(self, replica: int, num_running: int, num_waiting: int,
                     kv_cache_usage: float) -> None:
        """A replica's report (its SchedulerStats after a step): it covers what was routed
        to it before."""
        state = self.replicas[replica]
        state.num_running, state.num_waiting = num_running, num_waiting
        state.kv_cache_usage = kv_cache_usage
        state.routed_since_report = 0

    def set_available(self, replica: int, available: bool) -> None:
        """A replica died (False) or is back (True): back, it is a fresh process with an
        empty cache and no load."""
        if available and not self.replicas[replica].available:
            self.replicas[replica] = ReplicaState()
            self.prefixes[replica].clear()
        self.replicas[replica].available = available

    @property
    def available_replicas(self) -> list[int]:
        return [i for i, r in enumerate(self.replicas) if r.available]

    # ---- routing ------------------------------------------------------------------------

    def route(self, prompt_token_ids: list[int], cache_salt: str | tuple | None = None,
              user: str | None = None) -> RouteDecision:
        """The replica for a request; RuntimeError when none is up."""
        candidates = self.available_replicas
        if not candidates:
            raise RuntimeError("no engine replica is available")
        hashes = extend_block_hashes([], prompt_token_ids, self.block_size, cache_salt)
        replica = self._sticky(user, candidates)
        if replica is None:
            replica = self.choose(candidates, hashes)
        hit = self.prefixes[replica].match(hashes)
        self.prefixes[replica].insert(hashes)
        self.replicas[replica].routed_since_report += 1
        self.num_routed[replica] += 1
        if self.sticky_sessions and user is not None:
            self._sessions[user] = replica
        return RouteDecision(replica, hit, hit * self.block_size)

    def _sticky(self, user: str | None, candidates: list[int]) -> int | None:
        if not self.sticky_sessions or user is None:
            return None
        replica = self._sessions.get(user)
        if replica is None or replica not in candidates:
            return None
        if self.replicas[replica].load - self.least_loaded(candidates)[1] > self.balance_threshold:
            return None  # too far behind the others: the session moves
        return replica

    def least_loaded(self, candidates: list[int]) -> tuple[int, int]:
        """(replica, its load): the fewest requests, then the lowest KV usage, then index."""
        best = min(candidates, key=lambda i: (self.replicas[i].load,
                                              self.replicas[i].kv_cache_usage, i))
        return best, self.replicas[best].load

    @abstractmethod
    def choose(self, candidates: list[int], hashes: list[int]) -> int:
        """One of `candidates` (replicas that are up, never empty) for a prompt whose full
        blocks hash to `hashes`."""


@register("round_robin")
class RoundRobinRouter(RouterPolicy):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._next = 0

    def choose(self, candidates: list[int], hashes: list[int]) -> int:
        # The first replica at or after the cursor that is up: a dead one is skipped, and
        # the others keep their turns.
        replica = min(candidates, key=lambda i: (i - self._next) % self.num_replicas)
        self._next = (replica + 1) % self.num_replicas
        return replica


@register("least_load")
class LeastLoadRouter(RouterPolicy):
    def choose(self, candidates: list[int], hashes: list[int]) -> int:
        return self.least_loaded(candidates)[0]


@register("cache_aware")
class CacheAwareRouter(RouterPolicy):
    def choose(self, candidates: list[int], hashes: list[int]) -> int:
        least, least_load = self.least_loaded(candidates)
        matches = {i: self.prefixes[i].match(hashes) for i in candidates}
        best = max(candidates, key=lambda i: (matches[i], -self.replicas[i].load, -i))
        if matches[best] == 0:
            return least
        if self.replicas[best].load - least_load > self.balance_threshold:
            return least  # the cache would save less than the queue costs
        return best


def make_router(name: str, num_replicas: int, block_size: int, **kwargs) -> RouterPolicy:
    if name not in ROUTER_POLICIES:
        raise ValueError(f"unknown router policy {name!r}; known policies: "
                         f"{', '.join(sorted(ROUTER_POLICIES))}")
    return ROUTER_POLICIES[name](num_replicas, block_size, **kwargs)
