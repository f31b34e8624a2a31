"""Scheduling policies with a fake model and a fake clock (no torch): admission order,
budgets, victim choice, active preemption, swap vs recompute, swap-in precedence and
starvation freedom, for fcfs, priority and sjf.

`Sim` is also the driver of tests/core/test_scheduler_properties.py.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections import Counter, defaultdict

import pytest

from minivllm.core.policy import POLICIES, make_policy
from minivllm.core.request import Request, RequestStatus
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.core.sequence_group import SequenceGroup, form_group


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Sim:
    """Drives a Scheduler like the engine does, with a fake model: one clock second per step,
    one token for each request that samples, FINISHED_LENGTH at max_tokens.

    The fake model keeps fake KV contents (a slot holds the prefix it encodes) and applies
    every block mapping in the runner's order (swap-outs, copy-on-write copies all at once,
    swap-ins), so a wrong block table, swap mapping, copy or prefix hit shows up as a request
    reading slots that are not its own. It also keeps the runner's view of each block table,
    built only from the output's diffs, and checks it against the scheduler's. `check`
    asserts the budgets and the queue and block accounting after every schedule().

    Tokens are a function of the request's history (siblings of one prompt then write the
    same KV, as greedy ones would) unless `sample_seed` is given: then each sampled token is
    random, so siblings diverge and a missing copy-on-write copy is caught."""

    def __init__(self, policy: str = "fcfs", aging_s: float = 10.0,
                 sample_seed: int | None = None, policy_options: dict | None = None,
                 **config) -> None:
        config = {"num_blocks": 64, "block_size": 4, **config}
        self.clock = FakeClock()
        self.scheduler = Scheduler(SchedulerConfig(**config),
                                   make_policy(policy, aging_s, **(policy_options or {})),
                                   clock=self.clock)
        self.config = self.scheduler.config
        self.kv = self.scheduler.kv
        empty_block = lambda: [None] * self.config.block_size  # noqa: E731
        self.device: dict[int, list] = defaultdict(empty_block)  # block id -> slot contents
        self.host: dict[int, list] = defaultdict(empty_block)
        self.requests: dict[str, Request] = {}
        self.admitted: list[str] = []  # request ids in order of first admission
        self.finished_step: dict[str, int] = {}
        self.step_time: dict[int, float] = {}  # step -> the clock when it was scheduled
        self.outputs: list[SchedulerOutput] = []
        self.preemptions: list[tuple[int, str, RequestStatus]] = []  # step, id, status after
        self._token_ids = itertools.count(1000)
        self.rng = random.Random(sample_seed) if sample_seed is not None else None
        self.runner_tables: dict[str, list[int]] = {}  # the runner's view, from diffs only

    def add(self, request_id: str, prompt_len: int = 4, max_tokens: int = 4, priority: int = 0,
            prompt: list[int] | None = None, n: int = 1, **fields) -> Request:
        """A request arriving now; its prompt is fresh tokens unless given. With n > 1 it
        heads a group whose siblings fork from it, as the engine sets up parallel sampling.
        `fields`: more Request fields (user, ttft_slo_ms, ...)."""
        if prompt is None:
            prompt = [next(self._token_ids) for _ in range(prompt_len)]
        request = Request.make(request_id, prompt, max_tokens, self.clock.now, priority=priority,
                               **fields)
        siblings = [Request.make(f"{request_id}#{k}", prompt, max_tokens, self.clock.now,
                                 priority=priority, **fields) for k in range(1, n)]
        form_group([request, *siblings])
        for sibling in siblings:
            self.requests[sibling.request_id] = sibling
        self.scheduler.add_request(request)
        self.requests[request_id] = request
        return request

    def step(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        self.step_time[out.step] = self.clock.now
        self.check(out)
        self.preemptions += [(out.step, rid, self.requests[rid].status)
                             for rid in out.preempted_req_ids]
        self.admitted += [rid for rid in out.num_scheduled_tokens if rid not in self.admitted]
        self.apply_diffs(out)
        self.run_model(out)
        for request in self.scheduler.update_from_output(out, self.sample(out)):
            assert request.num_output_tokens <= request.max_tokens
            if request.num_output_tokens == request.max_tokens:
                self.scheduler.finish_request(request, RequestStatus.FINISHED_LENGTH)
                self.finished_step[request.request_id] = out.step
        self.outputs.append(out)
        self.clock.now += 1.0
        return out

    def run(self, max_steps: int = 1000, until=None) -> None:
        """Step until every request has finished (or `until()` holds); fail after max_steps."""
        until = until or (lambda: not self.scheduler.has_unfinished_requests())
        for _ in range(max_steps):
            if until():
                return
            self.step()
        assert until(), f"not done after {max_steps} steps: {self.scheduler.requests}"

    @staticmethod
    def scheduled_tokens(out: SchedulerOutput) -> dict[str, int]:
        return dict(out.num_scheduled_tokens)

    def scheduled(self, out: SchedulerOutput) -> list[tuple[Request, int]]:
        known = {**self.requests, **self.scheduler.requests}  # the latter holds forked siblings
        return [(known[rid], n) for rid, n in out.num_scheduled_tokens.items()]

    def sample(self, out: SchedulerOutput) -> dict[str, int | list[int]]:
        """A token for each request whose last token is computed this step; with draft
        tokens, the drafts the fake model agrees with and its own next token."""
        tokens = {}
        for r, n in self.scheduled(out):
            drafts = out.scheduled_spec_decode_tokens.get(r.request_id, [])
            if r.num_computed_tokens + n != r.num_tokens + len(drafts):
                continue
            history, new = list(r.all_token_ids), []
            for j in range(len(drafts) + 1):
                new.append(self.next_token(history))
                if j == len(drafts) or drafts[j] != new[-1]:
                    break
                history.append(new[-1])
            tokens[r.request_id] = new if drafts else new[0]
        return tokens

    def next_token(self, history: list[int]) -> int:
        """The fake model: random with `sample_seed`, else a function of the history."""
        return self.rng.randrange(997) if self.rng is not None else sum(history) % 997

    def abort(self, request_id: str) -> None:
        self.scheduler.finish_request(self.requests[request_id], RequestStatus.FINISHED_ABORTED)

    # ---- the fake model ------------------------------------------------------------------

    def slot(self, request: Request, position: int) -> tuple[list, int]:
        block_size = self.config.block_size
        return self.device[request.block_ids[position // block_size]], position % block_size

    def apply_diffs(self, out: SchedulerOutput) -> None:
        """The runner's side of the protocol: its block tables, from the output alone."""
        for rid in out.finished_req_ids:
            self.runner_tables.pop(rid)
        for new in out.scheduled_new_reqs:
            assert new.req_id not in self.runner_tables
            self.runner_tables[new.req_id] = list(new.block_ids)
        cached = out.scheduled_cached_reqs
        for rid, block_ids, replace in zip(cached.req_ids, cached.new_block_ids,
                                           cached.replace_block_ids):
            table = self.runner_tables[rid]
            self.runner_tables[rid] = list(block_ids) if replace else table + block_ids
        for r, _ in self.scheduled(out):
            assert self.runner_tables[r.request_id] == r.block_ids, r

    def run_model(self, out: SchedulerOutput) -> None:
        for device, host in out.swap_out:
            self.host[host] = list(self.device[device])
        sources = [list(self.device[src]) for src, _ in out.copies]  # every read first
        for (_, dst), contents in zip(out.copies, sources):
            self.device[dst] = contents
        for host, device in out.swap_in:
            self.device[device] = list(self.host[host])
        for r, n in self.scheduled(out):
            start = r.num_computed_tokens
            for position in range(start):  # attention reads the cached prefix ...
                slots, i = self.slot(r, position)
                assert slots[i] == tuple(r.all_token_ids[:position + 1]), (r, position)
            tokens = r.all_token_ids + out.scheduled_spec_decode_tokens.get(r.request_id, [])
            for position in range(start, start + n):  # ... and writes the new (drafts too)
                slots, i = self.slot(r, position)
                slots[i] = tuple(tokens[:position + 1])

    # ---- invariants ----------------------------------------------------------------------

    def check(self, out: SchedulerOutput) -> None:
        sched, kv, config = self.scheduler, self.kv, self.config
        assert not (out.swap_in and out.swap_out), "swap-in and swap-out in one step"
        assert len(sched.running) <= config.max_num_seqs
        assert out.total_num_scheduled_tokens <= config.max_num_batched_tokens
        for r, n in self.scheduled(out):
            assert r.status is RequestStatus.RUNNING and r in sched.running
            num_drafts = len(out.scheduled_spec_decode_tokens.get(r.request_id, ()))
            assert 1 <= n <= r.num_tokens - r.num_computed_tokens + num_drafts
            assert not num_drafts or n == 1 + num_drafts
            needed = r.num_computed_tokens + n
            assert len(r.block_ids) * config.block_size >= needed
        # Every unfinished request is in exactly the queue its status names.
        queues = {RequestStatus.WAITING: sched.waiting, RequestStatus.RUNNING: sched.running,
                  RequestStatus.SWAPPED: sched.swapped}
        queued = [r for q in queues.values() for r in q]
        assert sorted(r.request_id for r in queued) == sorted(sched.requests)
        for status, queue in queues.items():
            assert all(r.status is status for r in queue)
        for r in self.requests.values():
            assert r.num_output_tokens <= r.max_tokens
            if r.status is not RequestStatus.RUNNING:
                assert not r.block_ids, r
            if r.status is not RequestStatus.SWAPPED:
                assert not r.swap_block_ids, r
        # Reference counts are the holders; free blocks are exactly the unreferenced ones.
        holders = Counter(b for r in sched.requests.values() for b in r.block_ids)
        assert all(kv.blocks[b].ref_cnt == holders[b] for b in range(kv.num_blocks))
        assert set(kv.free_queue) == {b for b in range(kv.num_blocks) if not holders[b]}
        # The swap pool is partitioned between the free list and the swapped requests.
        swap_held = [b for r in sched.swapped for b in r.swap_block_ids]
        assert sorted(swap_held + kv.free_swap_blocks) == list(range(kv.num_swap_blocks))

    def assert_all_free(self) -> None:
        assert self.kv.num_free_blocks == self.kv.num_blocks
        assert len(self.kv.free_swap_blocks) == self.kv.num_swap_blocks


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(ValueError, match="edf, fcfs, goodput, hrrn, lpm, mlfq, priority, "
                                         "residual_sjf, sjf, vtc"):
        make_policy("lottery")
    assert set(POLICIES) == {"fcfs", "priority", "sjf", "mlfq", "vtc", "edf", "hrrn", "lpm",
                             "residual_sjf", "goodput"}


# ---- admission order ----------------------------------------------------------------------

@pytest.mark.parametrize("policy, expected", [
    ("fcfs", ["a", "b", "c"]),  # arrival order
    ("priority", ["c", "b", "a"]),  # lower priority value first
    ("sjf", ["b", "c", "a"]),  # prompt + max_tokens: 6 < 11 < 18
])
def test_admission_order(policy, expected):
    sim = Sim(policy, max_num_seqs=1)
    for request_id, prompt_len, max_tokens, priority in [
        ("a", 12, 6, 2), ("b", 4, 2, 1), ("c", 8, 3, 0),
    ]:
        sim.add(request_id, prompt_len, max_tokens, priority)
        sim.clock.now += 1.0
    sim.run()
    assert sim.admitted == expected
    assert sorted(sim.finished_step, key=sim.finished_step.get) == expected
    sim.assert_all_free()


def test_priority_ties_go_by_arrival():
    sim = Sim("priority", max_num_seqs=1)
    for request_id, priority in [("a", 1), ("b", 0), ("c", 1), ("d", 0)]:
        sim.add(request_id, priority=priority)
    sim.run()
    assert sim.admitted == ["b", "d", "a", "c"]


def test_sjf_counts_prefix_cached_prompt_tokens_as_done():
    sim = Sim("sjf", max_num_seqs=1)
    warm = sim.add("warm", prompt_len=16, max_tokens=4)
    sim.run()
    sim.add("fresh", prompt_len=8, max_tokens=4)  # 8 + 4 tokens of work
    sim.add("cached", prompt=warm.prompt_token_ids + [7], max_tokens=4)  # 17 - 16 + 4
    sim.run()
    assert sim.admitted == ["warm", "cached", "fresh"]


def test_sjf_predictor_caps_max_tokens_by_the_mean_output_length():
    policy = make_policy("sjf")
    finished = Request.make("done", [1, 2], max_tokens=3, arrival_time=0.0)
    finished.output_token_ids = [5, 6, 7]
    fresh = Request.make("new", [1, 2], max_tokens=100, arrival_time=0.0)
    assert policy.predictor.predict(fresh) == 100  # nothing seen yet
    policy.on_finished(finished)
    assert policy.predictor.predict(fresh) == 3
    assert policy.predictor.predict(Request.make("tiny", [1], max_tokens=1, arrival_time=0.0)) == 1


# ---- budgets ------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_budgets_are_respected_and_used(policy):
    sim = Sim(policy, max_num_seqs=3, max_num_batched_tokens=16)
    for i in range(10):
        sim.add(f"r{i}", prompt_len=3 + 3 * i, max_tokens=2 + i % 4, priority=i % 3)
    sim.run()  # Sim.check asserts both budgets at every step
    assert max(len(out.num_scheduled_tokens) for out in sim.outputs) == 3
    assert max(out.total_num_scheduled_tokens for out in sim.outputs) == 16  # chunked prefill fills it
    assert all(r.num_output_tokens == r.max_tokens for r in sim.requests.values())
    sim.assert_all_free()


def long_chunks(sim: Sim) -> list[int]:
    return [n for out in sim.outputs for r, n in sim.scheduled(out) if r.request_id == "long"]


def test_long_prefill_token_threshold_caps_each_requests_chunk():
    """vLLM's --long-prefill-token-threshold: a 40-token prompt in chunks of at most 8 while
    another request is in the engine, and the short prompt behind it admitted in the same
    first step, which the long one would otherwise fill; once alone it is not capped
    (vLLM's rule: nobody to leave room for)."""
    sim = Sim("fcfs", max_num_batched_tokens=16, long_prefill_token_threshold=8)
    sim.add("long", prompt_len=40, max_tokens=2)
    sim.add("short", prompt_len=6, max_tokens=2)
    sim.run()
    first = dict(sim.scheduled(sim.outputs[0]))
    assert {r.request_id: n for r, n in first.items()} == {"long": 8, "short": 6}
    # short: its prompt, one decode, finished; then long alone, in whole budgets
    assert long_chunks(sim) == [8, 8, 16, 8, 1]
    sim.assert_all_free()
    # without the cap the long prompt takes the whole first step
    sim = Sim("fcfs", max_num_batched_tokens=16)
    sim.add("long", prompt_len=40, max_tokens=2)
    sim.add("short", prompt_len=6, max_tokens=2)
    sim.run()
    assert {r.request_id: n for r, n in sim.scheduled(sim.outputs[0])} == {"long": 16}


def test_adaptive_threshold_raises_the_cap_to_a_fair_share_of_the_budget():
    """--long-prefill-token-threshold-adaptive: the cap is at least the budget over the
    requests in the engine (32 / 2 = 16 here, not 4)."""
    sim = Sim("fcfs", max_num_batched_tokens=32, long_prefill_token_threshold=4,
              long_prefill_token_threshold_adaptive=True)
    sim.add("long", prompt_len=40, max_tokens=2)
    sim.add("other", prompt_len=40, max_tokens=2)
    sim.run()
    assert {r.request_id: n for r, n in sim.scheduled(sim.outputs[0])} == {"long": 16,
                                                                            "other": 16}
    sim.assert_all_free()


def test_max_num_partial_prefills_limits_prompts_per_step():
    """--max-num-partial-prefills 2: three prompts, two prefill in a step, the third waits
    for a seat though the budget has room."""
    sim = Sim("fcfs", max_num_batched_tokens=64, max_num_partial_prefills=2)
    for i in range(3):
        sim.add(f"r{i}", prompt_len=10, max_tokens=3)
    sim.run()
    assert {r.request_id: n for r, n in sim.scheduled(sim.outputs[0])} == {"r0": 10, "r1": 10}
    # step 2: r0 and r1 decode (not prefills), r2 prefills
    assert {r.request_id: n for r, n in sim.scheduled(sim.outputs[1])} == {
        "r0": 1, "r1": 1, "r2": 10}
    sim.assert_all_free()


def test_max_long_partial_prefills_lets_short_prompts_pass_long_ones():
    """--max-long-partial-prefills 1 (threshold 8): of two long prompts one prefills at a
    time, and the short prompt queued behind the second long one passes it."""
    sim = Sim("fcfs", max_num_batched_tokens=64, long_prefill_token_threshold=8,
              max_num_partial_prefills=2, max_long_partial_prefills=1)
    sim.add("long", prompt_len=30, max_tokens=2)
    sim.add("long2", prompt_len=30, max_tokens=2)
    sim.add("short", prompt_len=6, max_tokens=2)
    sim.run()
    assert {r.request_id: n for r, n in sim.scheduled(sim.outputs[0])} == {"long": 8,
                                                                            "short": 6}
    assert all(sum(r.request_id.startswith("long") and r.num_tokens - n > 1
                   for r, n in sim.scheduled(out)) <= 1 for out in sim.outputs[:3])
    assert long_chunks(sim)[:4] == [8, 8, 8, 6]  # long2 waits until long's prompt is done
    sim.assert_all_free()


@pytest.mark.parametrize("config,message", [
    ({"long_prefill_token_threshold": -1}, "must be >= 0"),
    ({"long_prefill_token_threshold": 8, "enable_chunked_prefill": False}, "needs chunked"),
    ({"long_prefill_token_threshold_adaptive": True}, "needs long_prefill_token_threshold"),
    ({"max_num_partial_prefills": 0}, "must be >= 1"),
    ({"max_num_partial_prefills": 2, "enable_chunked_prefill": False}, "needs chunked"),
    ({"max_long_partial_prefills": 1}, "needs long_prefill_token_threshold"),
    ({"max_long_partial_prefills": 3, "max_num_partial_prefills": 2,
      "long_prefill_token_threshold": 8}, "must be <= max_num_partial_prefills"),
])
def test_bad_long_prefill_knobs_are_named(config, message):
    name = next(iter(config))
    with pytest.raises(ValueError, match=f"{name} {message}"):
        SchedulerConfig(max_num_batched_tokens=4096, **config)


def test_without_chunked_prefill_a_prompt_is_computed_in_one_piece():
    sim = Sim("fcfs", max_num_batched_tokens=16, enable_chunked_prefill=False)
    for i, prompt_len in enumerate([10, 9, 3, 12]):
        sim.add(f"r{i}", prompt_len, max_tokens=3)
    with pytest.raises(ValueError, match="max_num_batched_tokens=16 with chunked prefill"):
        sim.add("too-long", prompt_len=15, max_tokens=2)  # it would wait forever
    sim.run()
    for out in sim.outputs:
        for r, n in sim.scheduled(out):
            assert n == 1 or n == r.num_prompt_tokens
    # r1 (9 tokens) does not fit beside r0 (10) in step 1, and nobody overtakes it.
    assert list(sim.outputs[0].num_scheduled_tokens) == ["r0"]
    sim.assert_all_free()


# ---- victim choice, swap vs recompute -----------------------------------------------------

def crowded(policy: str, requests, **config) -> Sim:
    """Three 8-token prompts fill all 6 blocks in step 1; in step 2 the first one to decode
    needs a seventh block, so the policy's victim is preempted."""
    sim = Sim(policy, num_blocks=6, block_size=4, **config)
    for request_id, max_tokens, priority in requests:
        sim.add(request_id, prompt_len=8, max_tokens=max_tokens, priority=priority)
        sim.clock.now += 1.0
    assert not sim.step().preempted_req_ids
    return sim


@pytest.mark.parametrize("policy, requests, victim", [
    ("fcfs", [("a", 8, 0), ("b", 8, 0), ("c", 8, 0)], "c"),  # the latest arrival
    ("priority", [("a", 8, 1), ("b", 8, 0), ("c", 8, 1)], "c"),  # lowest, then latest
    ("priority", [("a", 8, 2), ("b", 8, 0), ("c", 8, 1)], "a"),
    ("sjf", [("a", 6, 0), ("b", 12, 0), ("c", 3, 0)], "b"),  # most work left
])
def test_victim_choice(policy, requests, victim):
    sim = crowded(policy, requests)
    out = sim.step()
    assert out.preempted_req_ids == [victim]
    sim.run()
    sim.assert_all_free()


@pytest.mark.parametrize("mode, num_swap_blocks, siblings, expected", [
    ("recompute", 8, 0, RequestStatus.WAITING),
    ("swap", 8, 0, RequestStatus.SWAPPED),
    ("swap", 1, 0, RequestStatus.WAITING),  # the swap pool is too small: recompute
    (None, 8, 0, RequestStatus.WAITING),  # default: one sequence -> recompute
    (None, 8, 1, RequestStatus.SWAPPED),  # default: several sequences -> swap
])
def test_swap_or_recompute(mode, num_swap_blocks, siblings, expected):
    sim = crowded("fcfs", [("a", 8, 0), ("b", 8, 0), ("c", 8, 0)],
                  preemption_mode=mode, num_swap_blocks=num_swap_blocks)
    victim = sim.requests["c"]
    victim.group = SequenceGroup([victim] + [Request.make(f"c-sibling{i}", [1], 1, 0.0)
                                             for i in range(siblings)])
    device_blocks = list(victim.block_ids)
    out = sim.step()
    assert out.preempted_req_ids == [victim.request_id] and victim.status is expected
    assert not victim.block_ids
    if expected is RequestStatus.SWAPPED:
        assert [d for d, _ in out.swap_out] == device_blocks
        assert [h for _, h in out.swap_out] == victim.swap_block_ids
        assert victim.num_computed_tokens == 8
    else:
        assert not out.swap_out and victim.num_computed_tokens == 0
    sim.run()  # the fake model checks that the swapped-in blocks hold c's prefix
    assert victim.num_output_tokens == 8
    sim.assert_all_free()


def test_preemptions_are_logged_with_who_how_and_why_at_most_every_5_s(caplog):
    sim = Sim("fcfs", num_blocks=6, block_size=2, preemption_mode="recompute")
    for i in range(6):
        sim.add(f"r{i}", prompt_len=2, max_tokens=6)
    with caplog.at_level(logging.WARNING, logger="minivllm.core.scheduler"):
        sim.run()
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == ("Request r5 preempted by recompute (out of KV blocks); "
                           "total preemptions: 1")
    assert 1 < len(messages) < len(sim.preemptions)
    logged = [int(m.rsplit(" ", 1)[1]) for m in messages]  # which preemptions were logged
    times = [sim.step_time[sim.preemptions[n - 1][0]] for n in logged]
    assert all(later - earlier > 5 for earlier, later in zip(times, times[1:]))


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_swapped_requests_come_back_before_any_waiting_one(policy):
    sim = crowded(policy, [("a", 8, 0), ("b", 8, 0), ("c", 8, 0)],
                  preemption_mode="swap", num_swap_blocks=16)
    assert sim.step().swap_out
    urgent = sim.add("urgent", prompt_len=1, max_tokens=1, priority=-5)  # outranks all
    steps_with_room = 0
    while urgent.first_scheduled_step is None:
        steps_with_room += sim.kv.num_free_blocks > 0  # its one block was there
        out = sim.step()
    assert steps_with_room > 0
    assert out.swap_in and not sim.scheduler.swapped  # it came in with the last swapped one
    sim.run()
    sim.assert_all_free()


def test_no_swap_out_in_a_step_that_swaps_in():
    """v is swapped out for h1, then swapped back in; in that same step h2 actively preempts
    it again, and since blocks are coming in, it is recomputed instead of swapped out."""
    sim = Sim("priority", max_num_seqs=2, preemption_mode="swap", num_swap_blocks=16,
              active_preemption=True, min_run_quantum=0)
    sim.add("s", prompt_len=8, max_tokens=10, priority=5)
    v = sim.add("v", prompt_len=8, max_tokens=10, priority=5)
    sim.step()
    sim.add("h1", max_tokens=1, priority=0)
    assert sim.step().swap_out and v.status is RequestStatus.SWAPPED
    sim.add("h2", max_tokens=1, priority=0)
    out = sim.step()
    assert out.swap_in and not out.swap_out
    assert out.preempted_req_ids == [v.request_id] and v.status is RequestStatus.WAITING
    sim.run()
    sim.assert_all_free()


def test_no_swap_in_in_a_step_that_swaps_out():
    """s is actively preempted while v, ranked lower, is protected by its run quantum. Later v
    is swapped out for lack of blocks: s would fit in what v frees, but waits a step."""
    sim = Sim("priority", num_blocks=7, max_num_seqs=2, preemption_mode="swap",
              num_swap_blocks=16, active_preemption=True, min_run_quantum=2)
    s = sim.add("s", prompt_len=4, max_tokens=16, priority=3)
    sim.add("f", prompt_len=4, max_tokens=2, priority=3)  # done in step 2, making room for v
    sim.step()
    sim.step()
    v = sim.add("v", prompt_len=16, max_tokens=8, priority=4)
    sim.step()
    sim.add("h", prompt_len=4, max_tokens=8, priority=0)
    assert sim.step().preempted_req_ids == ["s"]  # v has run for one step only
    sim.run(until=lambda: v.status is RequestStatus.SWAPPED)
    assert sim.outputs[-1].swap_out and not sim.outputs[-1].swap_in
    assert sim.kv.num_free_blocks >= len(s.swap_block_ids)
    assert sim.step().swap_in and s.status is RequestStatus.RUNNING
    sim.run()
    sim.assert_all_free()


# ---- active preemption --------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_active_preemption_after_the_run_quantum(mode):
    sim = Sim("priority", max_num_seqs=1, active_preemption=True, min_run_quantum=3,
              preemption_mode=mode, num_swap_blocks=16)
    sim.add("low", prompt_len=8, max_tokens=20, priority=5)
    sim.step()  # low is admitted in step 1
    sim.add("high", prompt_len=8, max_tokens=2, priority=0)
    sim.run()
    assert sim.preemptions[0][:2] == (1 + 3, "low")
    assert sim.requests["high"].first_scheduled_step == 4
    assert sim.finished_step["high"] < sim.finished_step["low"]
    sim.assert_all_free()


def test_no_active_preemption_by_default():
    sim = Sim("priority", max_num_seqs=1)
    sim.add("low", max_tokens=10, priority=5)
    sim.step()
    sim.add("high", max_tokens=2, priority=0)
    sim.run()
    assert not sim.preemptions
    assert sim.finished_step["low"] < sim.finished_step["high"]


def test_sjf_active_preemption_lets_a_short_job_in():
    sim = Sim("sjf", max_num_seqs=1, active_preemption=True, min_run_quantum=2)
    sim.add("long", max_tokens=40)
    sim.step()
    sim.add("short", max_tokens=2)
    sim.run()
    assert [p[1] for p in sim.preemptions] == ["long"]
    assert sim.finished_step["short"] < sim.finished_step["long"]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_equal_ranks_never_preempt_each_other(policy):
    """A later arrival of the same rank never outranks an earlier one, however long it
    waits: aging counts from arrival, for running requests too, so nothing ping-pongs."""
    sim = Sim(policy, aging_s=1.0, max_num_seqs=1, active_preemption=True, min_run_quantum=1)
    for i in range(3):
        sim.add(f"r{i}", max_tokens=12)
    sim.run()
    assert not sim.preemptions
    assert sim.admitted == ["r0", "r1", "r2"]


# ---- starvation freedom -------------------------------------------------------------------

def run_with_stream(policy: str, aging_s: float, newcomer: dict, steps: int, **config) -> Sim:
    """A long low-ranked request "old" arrives first; then, one every two steps, newcomers
    that each take two steps keep max_num_seqs=1 busy forever."""
    sim = Sim(policy, aging_s=aging_s, max_num_seqs=1, **config)
    sim.add("old", prompt_len=8, max_tokens=20, priority=3)
    for step in range(steps):
        if step % 2 == 0:
            sim.add(f"new{step}", **newcomer)
        sim.step()
    return sim


STREAMS = {  # the newcomers of each policy outrank "old" when they arrive
    "priority": {"prompt_len": 4, "max_tokens": 2, "priority": 0},
    "sjf": {"prompt_len": 4, "max_tokens": 2, "priority": 3},
}


@pytest.mark.parametrize("policy", sorted(STREAMS))
@pytest.mark.parametrize("active", [False, True])
def test_no_starvation_under_a_steady_stream(policy, active):
    config = {"active_preemption": active, "min_run_quantum": 4}
    starved = run_with_stream(policy, 1e9, STREAMS[policy], 300, **config)  # no aging
    assert "old" not in starved.finished_step
    # priority: "old" outranks newcomers once it is 3 * aging_s older; sjf: once its work (28)
    # divided by (1 + age / aging_s) is below a newcomer's (6). Then it runs its 20 tokens.
    sim = run_with_stream(policy, 5.0, STREAMS[policy], 300, **config)
    bound = {"priority": 3 * 5 + 4, "sjf": (28 / 6 - 1) * 5 + 4}[policy] + 20 + 2
    assert sim.finished_step["old"] <= bound
    assert len(sim.finished_step) > 140  # and the stream kept flowing


def test_a_victim_preempted_mid_step_swaps_in_all_its_blocks():
    """low is actively preempted after its last prefill chunk was allocated in that step, so it
    holds more blocks than its computed tokens need, and needs them all to come back."""
    sim = Sim("priority", num_blocks=34, block_size=1, max_num_seqs=2, max_num_batched_tokens=9,
              preemption_mode="swap", num_swap_blocks=32, active_preemption=True,
              min_run_quantum=0)
    sim.add("a", prompt_len=1, max_tokens=2, priority=1)
    low = sim.add("low", prompt_len=14, max_tokens=1, priority=5)
    sim.step()  # a: 1 token, low: 8
    sim.add("h", prompt_len=22, max_tokens=1, priority=0)
    assert sim.step().preempted_req_ids == ["low"]  # it was given its last 6 tokens; h takes them
    assert len(low.swap_block_ids) == 14 and low.num_computed_tokens == 8
    assert sim.scheduled_tokens(sim.step()) == {"h": 9}  # the whole budget
    out = sim.step()  # 4 tokens of budget left for low, but 12 free blocks for its 14
    assert sim.scheduled_tokens(out) == {"h": 5} and not out.swap_in
    out = sim.step()
    assert len(out.swap_in) == 14 and sim.scheduled_tokens(out) == {"low": 6}
    sim.run()
    sim.assert_all_free()
