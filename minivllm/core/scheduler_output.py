"""What the scheduler hands the model side each step: plain data, never live Requests.

A request's data crosses once, when the runner first sees it (NewRequestData); after that
only what changed does (CachedRequestData: its computed count, the block ids it was given).
The runner keeps the token ids itself — it sampled them — so none are sent back down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # a copy; empty unless it was sampled before (forks: never)
    block_ids: list[int]
    num_computed_tokens: int
    sampling_params: Any
    seed: int | None
    banned_until_min_tokens: tuple[int, ...]
    lora_int_id: int = 0  # its LoRA adapter (0: the base model)
    pooling_params: Any = None  # a pooling request's (resolved): the runner pools, not samples


@dataclass
class CachedRequestData:
    """Requests the runner already holds, one entry per list index."""

    req_ids: list[str] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    # Block ids to append to the request's table — or, where replace_block_ids is set, its
    # whole new table (after a swap-in, a recompute, or a copy-on-write of its last block).
    new_block_ids: list[list[int]] = field(default_factory=list)
    replace_block_ids: list[bool] = field(default_factory=list)

    def append(self, req_id: str, num_computed_tokens: int, block_ids: list[int],
               replace: bool) -> None:
        self.req_ids.append(req_id)
        self.num_computed_tokens.append(num_computed_tokens)
        self.new_block_ids.append(block_ids)
        self.replace_block_ids.append(replace)


@dataclass
class SchedulerOutput:
    step: int
    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    # request id -> tokens computed this step, in the scheduler's order
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    # request id -> its draft tokens (core/speculative.py): it computes its last token and
    # these (num_scheduled_tokens counts them), and samples at each of them.
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device, host)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (host, device)
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst)
    # The disk tier's (core/kv_disk_connector.py): evicted blocks to write first, (block, stable key);
    # blocks to fill from disk before the forward, (stable key, block).
    disk_writes: list[tuple[int, bytes]] = field(default_factory=list)
    disk_loads: list[tuple[bytes, int]] = field(default_factory=list)
    preempted_req_ids: list[str] = field(default_factory=list)
    # Finished or aborted since the last step: the runner drops their state.
    finished_req_ids: list[str] = field(default_factory=list)
    # The length predictor reads prompts' last hidden states (`probe`): the runner returns
    # the final-norm hidden row of the last prompt token of each request whose prefill
    # completes this step.
    want_prompt_hidden: bool = False

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not (self.num_scheduled_tokens or self.swap_out or self.swap_in or self.copies
                    or self.disk_writes or self.disk_loads or self.finished_req_ids)
