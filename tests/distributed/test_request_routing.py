"""RequestRouting (DataParallelClient's routing) without Ray: each request sent to the replica
the router picks, aborts to the replica holding them, a replica's requests routed again or
lost when it goes down, parked while none is up and sent when one is back."""

from __future__ import annotations

import time

import msgspec
import pytest

from minivllm.core.router import make_router
from minivllm.core.scheduler_stats import SchedulerStats
from minivllm.distributed.request_routing import RequestRouting
from minivllm.engine.messages import (
    EngineCoreAbort,
    EngineCoreInput,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
)
from minivllm.sampling_params import SamplingParams

_decode = msgspec.msgpack.Decoder(EngineCoreInput).decode


class FakeSockets:
    """A replica's sockets: what was sent, decoded."""

    def __init__(self) -> None:
        self.sent = []

    def send_bytes(self, data: bytes) -> None:
        self.sent.append(_decode(data))

    def send(self, msg) -> None:
        self.sent.append(msg)

    def added(self) -> list[str]:
        return [m.request_id for m in self.sent if isinstance(m, EngineCoreRequest)]


def request(request_id: str, priority: int = 0) -> EngineCoreRequest:
    return EngineCoreRequest(request_id, [1, 2, 3], SamplingParams(max_tokens=4), time.time(),
                             priority=priority)


def routing(n: int = 2):
    sockets = [FakeSockets() for _ in range(n)]
    routed = []
    return (RequestRouting(make_router("round_robin", n, 16), sockets,
                           on_routed=lambda *args: routed.append(args)), sockets, routed)


def started(routing_: RequestRouting, replica: int, *request_ids: str) -> None:
    routing_.record_step(replica, EngineCoreOutputs(
        time.time(), [EngineCoreOutput(r, new_token_ids=[7]) for r in request_ids],
        scheduler_stats=SchedulerStats(num_running=len(request_ids))))


def test_requests_go_where_the_router_says_and_aborts_to_their_replica():
    r, sockets, routed = routing()
    for request_id in ("a", "b", "c"):
        r.add(request(request_id))
    assert [s.added() for s in sockets] == [["a", "c"], ["b"]]
    assert [replica for replica, _ in routed] == [0, 1, 0]
    r.abort(["b", "c#1", "unknown"], stopped=True)  # "c#1": a sequence of request c
    assert sockets[0].sent[-1] == EngineCoreAbort(["c#1"], stopped=True)
    assert sockets[1].sent[-1] == EngineCoreAbort(["b"], stopped=True)


def test_a_field_msgpack_cannot_carry_is_a_value_error():
    r, sockets, _ = routing()
    with pytest.raises(ValueError, match="out of range"):
        r.add(request("big", priority=2**70))
    assert not any(s.sent for s in sockets)


def test_a_replica_down_reroutes_what_had_not_started_and_loses_the_rest():
    r, sockets, _ = routing()
    for request_id in ("a", "b", "c", "d"):  # a, c on 0; b, d on 1
        r.add(request(request_id))
    started(r, 0, "a")
    r.release(["c"])  # finished: nothing to route again
    rerouted, lost = r.replica_down(0)
    assert (rerouted, lost) == (0, ["a"])
    r.add(request("e"))
    assert sockets[1].added() == ["b", "d", "e"]  # 0 is skipped while down
    rerouted, lost = r.replica_down(1)
    assert (rerouted, lost) == (3, [])  # b, d and e: parked, no replica is up
    assert sockets[0].added() == ["a", "c"] and sockets[1].added() == ["b", "d", "e"]
    r.release(["d"])  # finished (or aborted) while parked: never sent again
    r.replica_up(1)
    assert sockets[1].added() == ["b", "d", "e", "b", "e"]


def test_release_forgets_a_request():
    r, sockets, _ = routing()
    r.add(request("a"))
    started(r, 0, "a")
    r.release(["a"])
    assert r.replica_down(0) == (0, [])
    r.abort(["a"], stopped=False)
    assert not any(isinstance(m, EngineCoreAbort) for m in sockets[0].sent)
