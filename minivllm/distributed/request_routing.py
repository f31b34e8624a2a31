"""RequestRouting: where DataParallelClient's requests go. Each request goes to the replica
the router (core/router.py, --router-policy; with --sticky-sessions, a `user` back to its
replica) picks, fed with each replica's load from its steps; its aborts go to the replica
holding it. When a replica goes down, the requests it had produced nothing for are routed
again (parked while no replica is up, sent when one is back) and those it was running are
lost: they cannot move, their client has had output.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from minivllm.core.router import RouterPolicy
from minivllm.engine.core_sockets import CoreSockets
from minivllm.engine.messages import EngineCoreAbort, EngineCoreOutputs, EngineCoreRequest


class RequestRouting:
    def __init__(self, router: RouterPolicy, sockets: list[CoreSockets],
                 on_routed: Callable[[int, int], None]) -> None:
        """`sockets`: each replica's; `on_routed(replica, prefix_hit_tokens)` for each
        request sent."""
        self.router = router
        self._sockets = sockets
        self._on_routed = on_routed
        self._encoder = msgspec.msgpack.Encoder()
        self._sent: dict[str, EngineCoreRequest] = {}  # not finished: routed again if need be
        self._encoded: dict[str, bytes] = {}
        self._owner: dict[str, int] = {}  # request id -> replica
        # each replica's, not finished; a dict as an ordered set, so a replica's requests are
        # routed again in arrival order
        self._held: list[dict[str, None]] = [{} for _ in sockets]
        self._started: set[str] = set()  # a replica has produced output for it
        self._parked: list[str] = []  # to route once a replica is up again

    def add(self, request: EngineCoreRequest) -> None:
        try:
            data = self._encoder.encode(request)
        except (OverflowError, msgspec.EncodeError) as e:  # JSON allows ints msgpack does not
            raise ValueError(f"a request field is out of range: {e}") from e
        # _dispatch sends it from here: again if its replica dies before it starts.
        self._sent[request.request_id] = request
        self._encoded[request.request_id] = data
        self._dispatch(request.request_id)

    def _dispatch(self, request_id: str) -> None:
        """Route a request and send it; parked while no replica is up."""
        request = self._sent[request_id]
        try:
            decision = self.router.route(request.prompt_token_ids, request.prefix_cache_key,
                                         request.user)
        except RuntimeError:  # every replica is down: Ray is restarting them
            self._parked.append(request_id)
            return
        self._held[decision.replica][request_id] = None
        self._owner[request_id] = decision.replica
        self._on_routed(decision.replica, decision.prefix_hit_tokens)
        self._sockets[decision.replica].send_bytes(self._encoded[request_id])

    def abort(self, request_ids: list[str], stopped: bool) -> None:
        """Each to the replica holding it (a sequence id: its request's)."""
        by_replica: dict[int, list[str]] = {}
        for seq_id in request_ids:
            owner = self._owner.get(seq_id)
            if owner is None:  # a sequence of n > 1: "request_id#index" (messages.seq_id)
                owner = self._owner.get(seq_id.rpartition("#")[0])
            if owner is not None:
                by_replica.setdefault(owner, []).append(seq_id)
        for owner, ids in by_replica.items():
            self._sockets[owner].send(EngineCoreAbort(ids, stopped=stopped))

    def release(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._sent.pop(request_id, None)
            self._encoded.pop(request_id, None)
            self._started.discard(request_id)
            owner = self._owner.pop(request_id, None)
            if owner is not None:
                self._held[owner].pop(request_id, None)
            if request_id in self._parked:
                self._parked.remove(request_id)

    def record_step(self, replica: int, msg: EngineCoreOutputs) -> None:
        """A replica's step: the requests it started, and its load for the router."""
        for out in msg.outputs:
            self._started.add(out.request_id)
        s = msg.scheduler_stats
        if s is not None:
            self.router.update_stats(replica, s.num_running, s.num_waiting, s.kv_cache_usage)

    def replica_down(self, replica: int) -> tuple[int, list[str]]:
        """Route its requests elsewhere: how many were routed again, and the ids lost."""
        self.router.set_available(replica, False)
        rerouted, lost = 0, []
        held, self._held[replica] = self._held[replica], {}
        for request_id in held:
            self._owner.pop(request_id, None)
            if request_id in self._started:  # its client has had output: it cannot move
                lost.append(request_id)
            elif request_id in self._sent:
                rerouted += 1
                self._dispatch(request_id)
        return rerouted, lost

    def replica_up(self, replica: int) -> None:
        """It is back: route to it again, and send the requests parked meanwhile."""
        self.router.set_available(replica, True)
        parked, self._parked = self._parked, []
        for request_id in parked:
            self._dispatch(request_id)
