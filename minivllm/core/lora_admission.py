"""LoRA in the scheduler (--enable-lora): the requests of one step use at most max_loras
adapters, so a queued request of another adapter waits until one of the running adapters has
no request; and the requests by adapter name, for SchedulerStats' LoRA fields."""

from __future__ import annotations

from collections.abc import Iterable

from minivllm.core.request import Request


class LoRAAdmission:
    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        self.requests_received: dict[str, int] = {}  # by adapter name, cumulative

    def received(self, request: Request) -> None:
        lora = request.core_request.lora_request
        if lora is not None:
            self.requests_received[lora.lora_name] = \
                self.requests_received.get(lora.lora_name, 0) + 1

    @staticmethod
    def in_use(running: Iterable[Request]) -> set[int]:
        """The adapters the running requests use (ids; 0, the base model, is none)."""
        return {r.core_request.lora_int_id for r in running} - {0}

    def full(self, request: Request, loras: set[int]) -> bool:
        """A request of an adapter no running request uses waits while the running requests
        already use max_loras adapters."""
        lora_id = request.core_request.lora_int_id
        return bool(lora_id) and lora_id not in loras and len(loras) >= self.max_loras

    @staticmethod
    def admit(request: Request, loras: set[int]) -> None:
        """The request runs: its adapter is in use."""
        if request.core_request.lora_int_id:
            loras.add(request.core_request.lora_int_id)

    def by_adapter(self, queue: Iterable[Request]) -> dict[str, int]:
        """The queue's requests by adapter name (walked only once a request named one)."""
        counts: dict[str, int] = {}
        if not self.requests_received:
            return counts
        for r in queue:
            if r.core_request.lora_request is not None:
                name = r.core_request.lora_request.lora_name
                counts[name] = counts.get(name, 0) + 1
        return counts
