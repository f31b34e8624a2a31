"""InputBatch: the runner's persistent per-request state, updated from the scheduler's diffs
(new requests in full, cached ones as appended or replaced block ids, finished ones dropped),
and a step's flattened inputs built from it, decodes first."""

from __future__ import annotations

import numpy as np

from minivllm.core.scheduler_output import NewRequestData, SchedulerOutput
from minivllm.model.input_batch import InputBatch

BLOCK_SIZE = 4


def new(req_id: str, prompt: list[int], block_ids: list[int], computed: int = 0,
        output: list[int] | None = None) -> NewRequestData:
    return NewRequestData(req_id, prompt, output or [], block_ids, computed,
                          sampling_params=None, seed=None, banned_until_min_tokens=())


def step(new_reqs=(), cached=(), finished=()) -> SchedulerOutput:
    """cached: (req_id, num_computed_tokens, block_ids, replace) entries."""
    out = SchedulerOutput(step=0, scheduled_new_reqs=list(new_reqs),
                          finished_req_ids=list(finished))
    for entry in cached:
        out.scheduled_cached_reqs.append(*entry)
    return out


def test_a_step_is_flattened_decodes_first_with_positions_and_slots():
    batch = InputBatch(max_blocks_per_request=8, block_size=BLOCK_SIZE)
    prefill = new("prefill", [10, 11, 12, 13, 14, 15], block_ids=[5, 2])
    # Resumed after 5 computed tokens of 6 (prompt and one output): it decodes its 6th.
    decode = new("decode", [20, 21, 22, 23, 24], block_ids=[7, 3], computed=5, output=[25])
    assert batch.apply(step([prefill, decode])) == [prefill, decode]
    inputs = batch.prepare({"prefill": 6, "decode": 1})
    assert inputs.req_ids == ["decode", "prefill"] and inputs.num_decodes == 1
    assert inputs.token_ids.tolist() == [25, 10, 11, 12, 13, 14, 15]
    assert inputs.positions.tolist() == [5, 0, 1, 2, 3, 4, 5]
    assert inputs.query_start_loc.tolist() == [0, 1, 7]
    assert inputs.seq_lens.tolist() == [6, 6]
    assert inputs.block_table.tolist() == [[7, 3], [5, 2]]  # as wide as the longest needs
    # position p of a request sits in slot block_ids[p // 4] * 4 + p % 4
    assert inputs.slot_mapping.tolist() == [3 * 4 + 1, 20, 21, 22, 23, 8, 9]


def test_requests_verifying_drafts_come_after_the_decodes_before_the_prefills():
    batch = InputBatch(max_blocks_per_request=8, block_size=BLOCK_SIZE)
    batch.apply(step([new("prefill", [1, 2, 3], block_ids=[1]),
                      new("verify", [4, 5, 6], block_ids=[2], computed=2),
                      new("decode", [7, 8], block_ids=[3], computed=1)]))
    inputs = batch.prepare({"prefill": 3, "verify": 3, "decode": 1}, verifying={"verify"})
    assert inputs.req_ids == ["decode", "verify", "prefill"]
    assert (inputs.num_decodes, inputs.num_verifies) == (1, 1)


def test_a_prefill_chunk_starts_at_the_computed_tokens():
    batch = InputBatch(max_blocks_per_request=8, block_size=BLOCK_SIZE)
    batch.apply(step([new("r", list(range(100, 110)), block_ids=[1, 2])]))
    first = batch.prepare({"r": 4})
    assert first.token_ids.tolist() == [100, 101, 102, 103]
    batch.apply(step(cached=[("r", 4, [6], False)]))  # one more block appended
    chunk = batch.prepare({"r": 6})
    assert chunk.token_ids.tolist() == list(range(104, 110))
    assert chunk.positions.tolist() == list(range(4, 10))
    assert chunk.block_table.tolist() == [[1, 2, 6]]
    assert chunk.slot_mapping.tolist() == [8, 9, 10, 11, 24, 25]


def test_replaced_block_ids_overwrite_the_table():
    batch = InputBatch(max_blocks_per_request=8, block_size=BLOCK_SIZE)
    batch.apply(step([new("r", [1, 2, 3, 4, 5], block_ids=[1, 2])]))
    batch.apply(step(cached=[("r", 0, [6, 7], True)]))  # recomputed into new blocks
    inputs = batch.prepare({"r": 5})
    assert inputs.block_table.tolist() == [[6, 7]]
    assert inputs.slot_mapping.tolist() == [24, 25, 26, 27, 28]


def test_sampled_tokens_are_appended_by_the_runner_itself():
    batch = InputBatch(max_blocks_per_request=64, block_size=BLOCK_SIZE)
    batch.apply(step([new("r", [1, 2], block_ids=list(range(20)))]))
    state = batch.requests["r"]
    for token in range(3, 60):  # grows past its initial room
        state.append(token)
    assert state.num_tokens == 59 and state.token_ids[:59].tolist() == list(range(1, 60))
    batch.apply(step(cached=[("r", 58, [], False)]))
    inputs = batch.prepare({"r": 1})
    assert inputs.token_ids.tolist() == [59] and inputs.positions.tolist() == [58]


def test_finished_requests_give_their_rows_back_and_rows_grow_when_needed():
    batch = InputBatch(max_blocks_per_request=4, block_size=BLOCK_SIZE)
    reqs = [new(f"r{i}", [i + 1], block_ids=[i]) for i in range(70)]  # more than 64 rows
    batch.apply(step(reqs))
    assert batch.block_table.shape[0] >= 70
    assert len({state.row for state in batch.requests.values()}) == 70
    inputs = batch.prepare({f"r{i}": 1 for i in range(70)})
    assert inputs.block_table[:, 0].tolist() == list(range(70))  # rows kept when it grew
    row = batch.requests["r3"].row
    batch.apply(step(finished=["r3"]))
    assert "r3" not in batch.requests and not batch.remove("r3")
    batch.apply(step([new("late", [9, 9], block_ids=[99])]))
    assert batch.requests["late"].row == row
    assert np.array_equal(batch.prepare({"late": 2}).block_table, [[99]])
