"""What the scheduler tells the runner of each request's block table: the whole table the
first time the runner sees the request (NewRequestData), after that only the block ids added
since the last step (core/scheduler_output.py) — or the whole table again where it changed
otherwise (a swap-in, a recompute, rejected drafts' blocks freed, a copy-on-write of its last
block)."""

from __future__ import annotations

from minivllm.core.kv_cache import KVCacheManager
from minivllm.core.request import Request
from minivllm.core.scheduler_output import NewRequestData, SchedulerOutput


class BlockTableDiffs:
    def __init__(self) -> None:
        # What the runner holds: request id -> how many of its block ids it has (-1: it must
        # be sent the whole table again), and the ids finished since the last step.
        self._known: dict[str, int] = {}
        self._finished: list[str] = []

    def resend(self, request_id: str) -> None:
        """The request's table changed other than by appending: send it whole."""
        if request_id in self._known:
            self._known[request_id] = -1

    def finished(self, request_id: str) -> None:
        """The request left: the runner drops it at the next step, if it held it."""
        if self._known.pop(request_id, None) is not None:
            self._finished.append(request_id)

    def emit(self, out: SchedulerOutput, scheduled: dict[str, tuple[Request, int]],
             kv: KVCacheManager) -> None:
        """Turn the step's decisions into data: new requests in full, the others as diffs."""
        copied = kv.pending_copies  # destinations of this step's copy-on-write copies
        for req_id, (request, num_new) in scheduled.items():
            out.num_scheduled_tokens[req_id] = num_new
            known = self._known.get(req_id)
            if known is None:
                out.scheduled_new_reqs.append(NewRequestData(
                    req_id, request.prompt_token_ids, list(request.output_token_ids),
                    list(request.block_ids), request.num_computed_tokens,
                    request.sampling_params, request.seed, request.banned_until_min_tokens,
                    request.core_request.lora_int_id, request.core_request.pooling_params))
            else:
                # A copy-on-write replaced its last block of the previous step (with draft
                # tokens, blocks may have been appended after it).
                replace = known < 0 or bool(copied and any(
                    b in copied for b in request.block_ids[max(known - 1, 0):]))
                out.scheduled_cached_reqs.append(
                    req_id, request.num_computed_tokens,
                    list(request.block_ids) if replace else request.block_ids[known:], replace)
            self._known[req_id] = len(request.block_ids)
        out.copies = kv.take_pending_copies()
        out.disk_writes, out.disk_loads = kv.take_disk_transfers()
        out.finished_req_ids, self._finished = self._finished, []
