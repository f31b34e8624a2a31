"""CoreSockets: the frontend's end of the two ZeroMQ sockets to an engine core — inputs go
out on a PUSH socket, the core's messages come back on a PULL one, both bound by the
frontend (the core connects: core_proc.connect_sockets) — and the msgpack encoding of what
crosses them (engine/messages.py). MPClient (mp_client.py: a process on this machine, over
IPC) and each data-parallel replica's client (distributed/ray_replica.py: a Ray actor, over
TCP) bind them to their own addresses."""

from __future__ import annotations

import msgspec
import zmq
import zmq.asyncio

from minivllm.engine.messages import EngineCoreMessage


class CoreSockets:
    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(EngineCoreMessage)
        self._zmq = zmq.Context()
        self._input = self._zmq.socket(zmq.PUSH)
        self._input.setsockopt(zmq.SNDHWM, 0)  # a send never blocks the event loop
        self._output = self._zmq.socket(zmq.PULL)
        self._output.setsockopt(zmq.RCVHWM, 0)
        self._readable: zmq.asyncio.Socket | None = None  # the output socket, for awaiting

    def bind(self, input_addr: str, output_addr: str) -> None:
        self._input.bind(input_addr)
        self._output.bind(output_addr)

    def bind_to_random_ports(self, host: str) -> tuple[str, str]:
        """Bind both over TCP on `host`; their addresses (input, output)."""
        input_port = self._input.bind_to_random_port(f"tcp://{host}")
        output_port = self._output.bind_to_random_port(f"tcp://{host}")
        return f"tcp://{host}:{input_port}", f"tcp://{host}:{output_port}"

    def encode(self, msg) -> bytes:
        """msgpack; OverflowError or msgspec.EncodeError for what it cannot carry."""
        return self._encoder.encode(msg)

    def send(self, msg) -> None:
        self.send_bytes(self.encode(msg))

    def send_bytes(self, data: bytes) -> None:
        try:
            self._input.send(data, flags=zmq.NOBLOCK)
        except zmq.ZMQError:  # the core is gone: its process's exit (or its run call) says so
            pass

    def recv_nowait(self) -> EngineCoreMessage | None:
        try:
            return self._decoder.decode(self._output.recv(flags=zmq.NOBLOCK))
        except zmq.Again:
            return None

    def poll(self, timeout_ms: int) -> bool:
        """Block until a message is here or timeout_ms passed (before the event loop runs)."""
        return bool(self._output.poll(timeout_ms))

    @property
    def readable(self) -> zmq.asyncio.Socket:
        """The output socket for the event loop's pollers (reads stay synchronous)."""
        if self._readable is None:
            self._readable = zmq.asyncio.Socket.from_socket(self._output)
        return self._readable

    async def wait_readable(self, timeout_ms: int) -> bool:
        """poll() for the event loop. Reads stay synchronous (recv_nowait): the messages
        that are already here are taken without a loop turn each."""
        return bool(await self.readable.poll(timeout_ms))

    def close(self) -> None:
        self._zmq.destroy(linger=0)
