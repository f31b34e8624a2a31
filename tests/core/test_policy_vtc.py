"""vtc on the fake clock: counters lifted when a tenant joins, service weighted w_p * prompt +
w_q * output, two backlogged tenants served within the paper's bound while one sends 10x
more, a light tenant served as if alone, and per-tenant weights sharing service in their
ratio."""

from __future__ import annotations

import pytest

from minivllm.core.policies.vtc import parse_vtc_tenant_weights, parse_vtc_weights
from minivllm.core.policy import PolicyConfig, make_policy
from minivllm.core.request import Request
from tests.core.test_scheduler_policies import Sim

PROMPT, OUTPUT = 4, 6


def served(sim: Sim, user: str, weights=(1.0, 2.0)) -> float:
    """w_p * prompt tokens of admitted requests + w_q * output tokens, for one tenant."""
    return sum(weights[0] * r.num_prompt_tokens * (r.first_scheduled_step is not None)
               + weights[1] * r.num_output_tokens
               for r in sim.requests.values() if r.core_request.user == user)


def two_tenants(policy: str, steps: int, heavy_per_step: int, light_every: int,
                light_per: int = 1, **config):
    """heavy sends heavy_per_step requests every step; light sends light_per every
    light_every steps. Yields the sim after each step with whether both are backlogged."""
    sim = Sim(policy, num_blocks=8, block_size=4, max_num_seqs=4, max_num_batched_tokens=16,
              **config)
    n = 0
    for step in range(steps):
        for _ in range(heavy_per_step):
            sim.add(f"h{n}", PROMPT, OUTPUT, user="heavy")
            n += 1
        if step % light_every == 0:
            for _ in range(light_per):
                sim.add(f"l{n}", PROMPT, OUTPUT, user="light")
                n += 1
        sim.step()
        waiting = {r.core_request.user for r in sim.scheduler.waiting}
        yield sim, waiting == {"heavy", "light"}


def test_two_backlogged_tenants_stay_within_the_papers_bound_while_one_sends_10x_more():
    # U = max(w_p * L_input, w_q * M): M = the 32 tokens the KV cache holds.
    bound = 2 * max(1 * PROMPT, 2 * 8 * 4)
    gaps = {}
    for policy in ("vtc", "fcfs"):
        worst = 0.0
        for sim, backlogged in two_tenants(policy, 100, heavy_per_step=10, light_every=1):
            if backlogged:
                worst = max(worst, abs(served(sim, "heavy") - served(sim, "light")))
        gaps[policy] = worst
    assert gaps["vtc"] <= bound
    assert gaps["fcfs"] > 5 * bound  # the heavy tenant takes ~10/11 of the service


def test_a_light_tenant_is_served_as_if_alone():
    """light sends one request every 8 steps (below its half); heavy floods the queue."""
    def light_ttft(heavy_per_step: int, policy: str, **config) -> float:
        ttfts = []
        *_, (sim, _) = two_tenants(policy, 80, heavy_per_step, light_every=8, **config)
        for r in sim.requests.values():
            if r.core_request.user == "light" and r.first_scheduled_step is not None:
                ttfts.append(r.first_scheduled_step - r.arrival_time)
        return sum(ttfts) / len(ttfts)

    alone = light_ttft(0, "vtc")
    assert alone == 1.0
    # First in line at once; then it waits for a seat, never longer than a request's run.
    assert light_ttft(10, "vtc") < alone + OUTPUT
    # With active preemption it takes a heavy request's seat (past its run quantum).
    active = {"active_preemption": True, "min_run_quantum": 1}
    assert light_ttft(10, "vtc", **active) <= alone + 0.5
    assert light_ttft(10, "fcfs") > 10 * alone


def test_a_joining_tenant_is_lifted_to_the_least_served_active_tenant():
    policy = make_policy("vtc")
    a = Request.make("a", [1] * 10, 5, 0.0, user="alice")
    policy.on_arrival(a, 0.0)
    a.first_scheduled_step, a.output_token_ids = 1, [7, 7]
    policy.on_step([a], 1.0)
    assert policy.counters["alice"] == 10 + 2 * 2
    b = Request.make("b", [1] * 3, 5, 1.0, user="bob")
    policy.on_arrival(b, 1.0)
    assert policy.counters["bob"] == 14  # no credit for the time before it joined
    policy.on_removed(a)
    policy.on_removed(b)
    c = Request.make("c", [1] * 3, 5, 2.0, user="carol")
    policy.on_arrival(c, 2.0)  # nobody active: nothing to lift to
    assert policy.counters["carol"] == 0


def test_order_charges_each_prompt_before_picking_the_next():
    """One step may admit several requests: alice's 100-token prompt is charged before the
    next pick, so bob (counter 50) goes next, not alice's second request."""
    policy = make_policy("vtc")
    policy.counters.update({"alice": 0.0, "bob": 50.0})
    reqs = [Request.make("a1", [1] * 100, 5, 0.0, user="alice"),
            Request.make("a2", [1] * 100, 5, 1.0, user="alice"),
            Request.make("b1", [1] * 10, 5, 2.0, user="bob")]
    assert [r.request_id for r in policy.order(reqs, 3.0)] == ["a1", "b1", "a2"]


@pytest.mark.parametrize("bad", ["1", "1,2,3", "0,1", "a,b", "-1,2", "inf,1"])
def test_bad_weights_are_named(bad):
    with pytest.raises(ValueError, match="vtc_weights"):
        parse_vtc_weights(bad)
    assert parse_vtc_weights("1,2") == (1.0, 2.0)


@pytest.mark.parametrize("weights, ratio", [(None, 1.0), ("heavy=2,light=1", 2.0),
                                            ('{"light": 2}', 0.5)])
def test_tenant_weights_share_service_in_their_ratio(weights, ratio):
    """Both tenants always backlogged: heavy gets `ratio` times light's service (none given:
    equal shares, as before weights existed). Every request has one shape, so served tokens
    go in the same ratio."""
    *_, (sim, backlogged) = two_tenants("vtc", 200, heavy_per_step=2, light_every=1,
                                        light_per=2,
                                        policy_options={"vtc_tenant_weights": weights})
    assert backlogged
    assert served(sim, "heavy") / served(sim, "light") == pytest.approx(ratio, rel=0.05)


def test_a_tenant_weight_slows_its_counter():
    policy = make_policy("vtc", vtc_tenant_weights="alice=2")
    a = Request.make("a", [1] * 10, 5, 0.0, user="alice")
    b = Request.make("b", [1] * 10, 5, 0.0, user="bob")
    for r in (a, b):
        policy.on_arrival(r, 0.0)
        r.first_scheduled_step = 1
    policy.on_step([a, b], 1.0)
    assert policy.counters == {"alice": 5.0, "bob": 10.0}


@pytest.mark.parametrize("bad", ["alice", "alice=0", "alice=-1", "alice=x", "alice=1,alice=2",
                                 "alice=inf", '{"alice": "heavy"}', "{bad json", ""])
def test_bad_tenant_weights_name_the_flag(bad):
    with pytest.raises(ValueError, match="--vtc-tenant-weights"):
        parse_vtc_tenant_weights(bad)
    with pytest.raises(ValueError, match="vtc_tenant_weights"):
        PolicyConfig(scheduling_policy="fcfs", vtc_tenant_weights=bad)


def test_tenant_weights_spellings():
    assert parse_vtc_tenant_weights(None) == {}
    assert parse_vtc_tenant_weights(" alice=2, bob=0.5") == {"alice": 2.0, "bob": 0.5}
    assert parse_vtc_tenant_weights('{"alice": 2, "": 3}') == {"alice": 2.0, "": 3.0}
    assert parse_vtc_tenant_weights({"alice": 2}) == {"alice": 2.0}
