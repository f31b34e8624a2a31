"""minivllm's own counters in a server's /metrics, over one bench run: the recompute tax
(tokens computed again after recompute preemption, of all computed tokens) and the requests
that edf / goodput shed or deprioritized. A server that exports none of them (vLLM, or no
/metrics at all) gives None, and the report says so."""

from __future__ import annotations

import urllib.request

# Summary field -> the Prometheus counter (summed over its labels: a data-parallel server
# has one series per replica).
COUNTERS = {"recomputed_tokens": "minivllm:num_recomputed_tokens_total",
            "computed_tokens": "minivllm:num_computed_tokens_total",
            "requests_shed": "minivllm:num_requests_shed_total",
            "requests_deprioritized": "minivllm:num_requests_deprioritized_total"}


def scrape(base_url: str) -> dict[str, float] | None:
    """The counters the server exports (of COUNTERS), or None where it exports none of them
    or /metrics cannot be read."""
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:  # unreachable, or an HTTP error such as 404
        return None
    totals = {}
    for line in text.splitlines():
        for field, name in COUNTERS.items():
            if line.startswith(name + "{") or line.startswith(name + " "):
                totals[field] = totals.get(field, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals or None


def over_run(before: dict | None, after: dict | None) -> dict | None:
    """What the counters did between two scrapes, with the recompute tax; a counter the
    server does not export is None. `before` None (not scraped): counted from zero."""
    if after is None:
        return None
    before = before or {}
    fields = {f: int(after[f] - before.get(f, 0.0)) if f in after else None for f in COUNTERS}
    computed, recomputed = fields["computed_tokens"], fields["recomputed_tokens"]
    tax = None
    if computed is not None and recomputed is not None:
        tax = recomputed / computed if computed else 0.0
    return {"recompute_tax": tax, **fields}


def describe(server: dict | None) -> str:
    """One line for the run's summary."""
    if server is None:
        return ("server counters: none (not a minivllm server: no minivllm:* counters in its "
                "/metrics), so no recompute tax or shed counts")

    def n(field: str) -> str:
        return "-" if server[field] is None else str(server[field])

    tax = server["recompute_tax"]
    tax_text = "-" if tax is None else (f"{tax:.2%} ({n('recomputed_tokens')} of "
                                        f"{n('computed_tokens')} computed tokens recomputed)")
    return (f"server counters over this run (minivllm /metrics): recompute tax {tax_text}; "
            f"requests shed {n('requests_shed')}, deprioritized {n('requests_deprioritized')}")
