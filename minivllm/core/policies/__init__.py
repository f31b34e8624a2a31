"""The policy zoo beyond fcfs, priority and sjf: one class per file, each registered in
core/policy.py's POLICIES when this package is imported (policy.py imports it)."""

from minivllm.core.policies import edf, hrrn, mlfq, vtc  # noqa: F401
