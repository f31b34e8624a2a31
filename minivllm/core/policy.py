"""Scheduling policies by name: the registry, the factory and their settings (PolicyConfig).

A policy ranks requests with `sort_key` (smaller runs first; core/policies/base.py). From
that one rule come the order of the waiting, swapped and running queues, the victim when
memory runs out and active preemption. Adding a policy is one class in core/policies/ and one
entry in POLICIES; its options are PolicyConfig fields, which its `validate_options` checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.core.length_predictor import check_length_predictor, make_length_predictor
from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.policies.edf import EarliestDeadlineFirstPolicy
from minivllm.core.policies.fcfs import FCFSPolicy
from minivllm.core.policies.goodput import GoodputAdmissionPolicy
from minivllm.core.policies.hrrn import HighestResponseRatioNextPolicy
from minivllm.core.policies.lpm import LongestPrefixMatchPolicy
from minivllm.core.policies.mlfq import MultiLevelFeedbackQueuePolicy
from minivllm.core.policies.priority import PriorityPolicy
from minivllm.core.policies.residual_sjf import ResidualPrefillSJFPolicy
from minivllm.core.policies.sjf import ShortestJobFirstPolicy
from minivllm.core.policies.vtc import VirtualTokenCounterPolicy

POLICIES: dict[str, type[SchedulingPolicy]] = {cls.name: cls for cls in (
    FCFSPolicy, PriorityPolicy, ShortestJobFirstPolicy, EarliestDeadlineFirstPolicy,
    HighestResponseRatioNextPolicy, MultiLevelFeedbackQueuePolicy, VirtualTokenCounterPolicy,
    LongestPrefixMatchPolicy, ResidualPrefillSJFPolicy, GoodputAdmissionPolicy)}


def check_policy(name: str) -> None:
    if name not in POLICIES:
        raise ValueError(
            f"unknown scheduling_policy {name!r}; known policies: {', '.join(sorted(POLICIES))}"
        )


def make_policy(name: str, aging_s: float = 10.0,
                length_predictor: str = "mean", **options) -> SchedulingPolicy:
    """`options`: policy settings by name (vtc_weights, edf_action, ...); each policy takes
    those its `option_names` list and ignores the others."""
    check_policy(name)
    cls = POLICIES[name]
    return cls(aging_s=aging_s, predictor=make_length_predictor(length_predictor),
               **own_options(cls, options))


def own_options(cls: type[SchedulingPolicy], options: dict) -> dict:
    """The options of `options` that policy `cls` takes and that are set."""
    return {k: v for k, v in options.items() if k in cls.option_names and v is not None}


@dataclass
class PolicyConfig:
    """Which policy ranks requests, with what output-length predictor, and every policy's
    options (vtc's token weights "W_P,W_Q" and tenant weights "TENANT=W,..."; edf's action on
    a request past its deadline, and the deadlines, ms after arrival, of requests that give
    none; mlfq's first quantum in decode iterations). Each is checked by the policy that
    takes it, whichever one runs."""

    scheduling_policy: str = "fcfs"
    priority_aging_s: float = 10.0  # waiting this long improves effective priority by one level
    # What SJF (and any policy that ranks by output length) predicts it with: mean | oracle |
    # bucket | probe (core/length_predictor.py).
    length_predictor: str = "mean"
    # A JSON line per finished request (prompt tokens, predicted and true output length):
    # what bench reads to report the predictor's Kendall tau and error.
    length_prediction_log: str | None = None
    vtc_weights: str = "1,2"
    vtc_tenant_weights: str | None = None  # None: every tenant weighs 1
    edf_action: str = "shed"
    ttft_slo_ms: float | None = None
    e2e_slo_ms: float | None = None
    mlfq_base_quantum: int = 4
    residual_sjf_max_wait_ms: float = 10000.0

    def __post_init__(self) -> None:
        check_policy(self.scheduling_policy)
        if not self.priority_aging_s > 0:
            raise ValueError(f"priority_aging_s must be > 0, got {self.priority_aging_s!r}")
        check_length_predictor(self.length_predictor)
        options = self.options()
        for cls in POLICIES.values():
            cls.validate_options(**own_options(cls, options))

    def options(self) -> dict:
        """Every policy's options, by name."""
        return {name: getattr(self, name)
                for cls in POLICIES.values() for name in cls.option_names}

    def make_policy(self) -> SchedulingPolicy:
        return make_policy(self.scheduling_policy, self.priority_aging_s,
                           self.length_predictor, **self.options())
