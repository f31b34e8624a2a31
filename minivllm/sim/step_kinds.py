"""A cost model's error on measured steps, per step kind: decode-only, prefill-only and
mixed steps cost differently (a decode step reads the weights for a few rows, a prefill step
computes many), so one aggregate error can hide a kind the model gets wrong."""

from __future__ import annotations

import numpy as np

from minivllm.core.step_batch import StepBatch

STEP_KINDS = ("decode-only", "prefill-only", "mixed")


def step_kind(b: StepBatch) -> str:
    if not b.num_prefill_seqs:
        return "decode-only"
    return "mixed" if b.num_decode_seqs else "prefill-only"


def relative_errors(measured: list[tuple[StepBatch, float, float]]) -> dict:
    """(batch, measured seconds, predicted seconds) -> {kind or 'all': {n, median, p90,
    bias}}: the median and p90 of |predicted - measured| / measured, and the median of the
    signed error (predicted - measured) / measured — a bias, unlike scatter, accumulates
    over a request's steps into its TPOT; a kind without steps is left out."""
    groups: dict[str, list[float]] = {}
    for b, actual, predicted in measured:
        error = (predicted - actual) / actual
        groups.setdefault("all", []).append(error)
        groups.setdefault(step_kind(b), []).append(error)
    return {kind: {"n": len(errors), "median": float(np.median(np.abs(errors))),
                   "p90": float(np.percentile(np.abs(errors), 90)),
                   "bias": float(np.median(errors))}
            for kind in ("all", *STEP_KINDS) if (errors := groups.get(kind))}


def describe(errors: dict) -> str:
    """'all 6.1% / 14% (bias +2.0%, n 120); decode-only ...': median / p90 per kind (a
    table saved before the bias was recorded shows none)."""
    return "; ".join(f"{kind} {e['median']:.1%} / {e['p90']:.1%} ("
                     + (f"bias {e['bias']:+.1%}, " if "bias" in e else "") + f"n {e['n']})"
                     for kind, e in errors.items())
