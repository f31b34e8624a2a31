"""wait_core_ready, the ready handshake MPClient and the data-parallel replicas share: the
core's max_model_len, its refusal (ValueError for a bad setting), its exit, its silence."""

from __future__ import annotations

import pytest

from minivllm.engine.core_handshake import wait_core_ready
from minivllm.engine.messages import EngineCoreDead, EngineCoreReady


class FakeSockets:
    def __init__(self, *messages) -> None:
        self.messages = list(messages)

    def poll(self, timeout_ms: int) -> bool:
        return bool(self.messages)

    def recv_nowait(self):
        return self.messages.pop(0)


def alive() -> None:
    return None


def test_ready_gives_max_model_len():
    assert wait_core_ready(FakeSockets(EngineCoreReady(max_model_len=512)), 5, alive,
                           "the core") == 512


def test_a_refused_setting_is_a_value_error_and_a_failure_a_runtime_error():
    with pytest.raises(ValueError, match="bad block size"):
        wait_core_ready(FakeSockets(EngineCoreDead("bad block size", bad_config=True)), 5,
                        alive, "the core")
    with pytest.raises(RuntimeError, match="out of memory"):
        wait_core_ready(FakeSockets(EngineCoreDead("out of memory")), 5, alive, "the core")


def test_an_exit_without_a_word_and_silence_are_runtime_errors():
    with pytest.raises(RuntimeError, match="exited with 9"):
        wait_core_ready(FakeSockets(), 5, lambda: "exited with 9", "the core")
    with pytest.raises(RuntimeError, match="replica 1 did not start in 0s"):
        wait_core_ready(FakeSockets(), 0.2, alive, "replica 1")
