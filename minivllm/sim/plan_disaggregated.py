"""`minivllm sim plan --disaggregated`: the prefill/decode split (sim/disaggregated.py) for
the plan's SLOs, against colocated replicas of the same total.

Without --target-rate: for --instances N, the highest rate each split (P prefill + D decode
= N) sustains within the SLOs, and that of N colocated replicas behind the router (each by
sim/plan.py's search, each rate over the plan's seeds); the answer is the split with the
highest, its goodput per instance beside colocated's (DistServe's measure: the highest rate
served within the SLOs, divided by the instances that serve it).

With --target-rate R: the fewest instances, and their split, that serve R within the SLOs,
each total from 2 up and each of its splits checked by simulation, beside the colocated
replicas R needs.
"""

from __future__ import annotations

from collections.abc import Callable

from minivllm.sim.plan import PlanError, Probe, max_rate

# probe(rate, instances, (prefill, decode) or None for colocated replicas)
SplitProbe = Callable[[float, int, "tuple[int, int] | None"], Probe]


def splits(total: int) -> list[tuple[int, int]]:
    return [(p, total - p) for p in range(1, total)]


def _searched(probe: SplitProbe, total: int, split, start: float, tolerance: float
              ) -> tuple[float | None, list[Probe]]:
    """The highest rate within the SLOs (None: they held at every rate tried)."""
    try:
        return max_rate(lambda rate: probe(rate, total, split), start, tolerance)
    except PlanError:
        return None, []


def _row(rate: float | None, total: int, **fields) -> dict:
    return {**fields, "max_request_rate": rate,
            "per_instance": None if rate is None else rate / total}


def compare_splits(probe: SplitProbe, total: int, start: float, tolerance: float
                   ) -> tuple[dict, list[Probe]]:
    """Every split of `total` instances and `total` colocated replicas at their highest
    rates within the SLOs: (the answer for plan.json, every probe)."""
    if total < 2:
        raise ValueError(f"--instances must be >= 2 (a prefill and a decode one), got {total}")
    rows, probes = [], []
    for p, d in splits(total):
        rate, found = _searched(probe, total, (p, d), start, tolerance)
        rows.append(_row(rate, total, prefill=p, decode=d))
        probes += found
    colocated_rate, found = _searched(probe, total, None, start, tolerance)
    probes += found
    best = max(rows, key=lambda r: -1 if r["max_request_rate"] is None
               else r["max_request_rate"])
    colocated = _row(colocated_rate, total, replicas=total)
    ratio = (best["max_request_rate"] / colocated_rate
             if best["max_request_rate"] is not None and colocated_rate else None)
    return {"instances": total, "splits": rows, "best": best, "colocated": colocated,
            "disaggregated_over_colocated": ratio}, probes


def fewest_for_target(probe: SplitProbe, target: float, max_total: int
                      ) -> tuple[dict, list[Probe]]:
    """The fewest instances whose split serves `target` req/s within the SLOs (totals 2 ..
    max_total): (the answer for plan.json, every probe)."""
    probes = []
    for total in range(2, max_total + 1):
        for p, d in splits(total):
            check = probe(target, total, (p, d))
            probes.append(check)
            if check.met:
                return {"target_rate": target, "instances": total, "prefill": p,
                        "decode": d}, probes
    return {"target_rate": target, "instances": None, "prefill": None, "decode": None,
            "tried_up_to": max_total}, probes


def describe(answer: dict) -> list[str]:
    """The lines `sim plan --disaggregated` prints about its answer."""
    lines = []
    if "splits" in answer:
        total = answer["instances"]
        for row in answer["splits"] + [answer["colocated"]]:
            name = (f"{row['prefill']}P + {row['decode']}D" if "prefill" in row
                    else f"{total} colocated")
            rate = row["max_request_rate"]
            lines.append(f"{name}: " + ("the SLOs held at every rate tried" if rate is None
                                       else f"{rate:.4g} req/s, {row['per_instance']:.4g} "
                                            "per instance"))
        best, ratio = answer["best"], answer["disaggregated_over_colocated"]
        if ratio is not None:
            lines.append(f"best split of {total}: {best['prefill']}P + {best['decode']}D, "
                         f"{ratio:.2f}x the goodput of {total} colocated replicas")
    if "target_rate" in answer:
        if answer["instances"] is None:
            lines.append(f"{answer['target_rate']:g} req/s: no split of up to "
                         f"{answer['tried_up_to']} instances meets the SLOs")
        else:
            lines.append(f"{answer['target_rate']:g} req/s needs {answer['instances']} "
                         f"disaggregated instances: {answer['prefill']} prefill + "
                         f"{answer['decode']} decode")
    return lines
