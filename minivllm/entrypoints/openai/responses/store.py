"""The responses /v1/responses keeps (store: true, the default): in memory, the least
recently used evicted past --responses-store-size (0: none kept). A stored response is what
GET /v1/responses/{id} returns and what a later request's previous_response_id continues."""

from __future__ import annotations

import argparse
from collections import OrderedDict
from dataclasses import dataclass

from minivllm.entrypoints.openai.protocol import ChatMessage
from minivllm.entrypoints.openai.responses.protocol import ResponseObject

DEFAULT_STORE_SIZE = 1000


def _store_size(text: str) -> int:
    size = int(text)
    if size < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {size}")
    return size


def add_responses_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--responses-store-size", type=_store_size, default=DEFAULT_STORE_SIZE,
                        metavar="N",
                        help="how many /v1/responses answers are kept in memory for GET and "
                             "previous_response_id, least recently used evicted first; 0 "
                             f"keeps none (default: {DEFAULT_STORE_SIZE})")


@dataclass
class StoredResponse:
    response: ResponseObject
    # The conversation up to and with this response's output, as chat messages (without
    # its instructions: OpenAI does not carry them over to the next turn)
    messages: list[ChatMessage]


class ResponseStore:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def put(self, stored: StoredResponse) -> None:
        self._items[stored.response.id] = stored
        self._items.move_to_end(stored.response.id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        stored = self._items.get(response_id)
        if stored is not None:
            self._items.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> bool:
        return self._items.pop(response_id, None) is not None
