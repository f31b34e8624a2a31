"""What the prefix cache's disk tier did in a simulated run, for its report and its printed
lines; with --kv-offloading-warm-restart, the run after the restart with the tier as left
(warm) beside the one with an empty tier (cold): the tokens the persistent tier spared the
prefills, and the TTFT it changed."""

from __future__ import annotations

import numpy as np

from minivllm.sim.simulator import SimResult


def run_figures(result: SimResult) -> dict:
    s = result.stats.scheduler
    ttft = np.asarray([r.ttft for r in result.results if r.ttft is not None]) * 1e3
    return {"kv_disk_hit_tokens": s.kv_disk_hits, "prefix_cache_hits": s.prefix_cache_hits,
            "computed_tokens": s.num_computed_tokens,
            "kv_disk_bytes_read": s.kv_disk_bytes_read,
            "kv_disk_bytes_written": s.kv_disk_bytes_written,
            "kv_disk_evictions": s.kv_disk_evictions,
            "mean_ttft_ms": float(ttft.mean()) if ttft.size else None,
            "p50_ttft_ms": float(np.percentile(ttft, 50)) if ttft.size else None,
            "p99_ttft_ms": float(np.percentile(ttft, 99)) if ttft.size else None,
            "simulated_wall_time_s": result.stats.simulated_wall_time_s}


def warm_restart(result: SimResult) -> dict:
    """After the restart: with an empty tier (cold) and with the tier as left (warm)."""
    cold, warm = run_figures(result.cold), run_figures(result)
    return {"cold": cold, "warm": warm,
            "computed_tokens_saved": cold["computed_tokens"] - warm["computed_tokens"]}


def describe_tier(figures: dict) -> str:
    return (f"disk tier: {figures['kv_disk_hit_tokens']} prompt tokens loaded instead of "
            f"recomputed, {figures['kv_disk_bytes_read'] / 1e9:.3g} GB read, "
            f"{figures['kv_disk_bytes_written'] / 1e9:.3g} GB written, "
            f"{figures['kv_disk_evictions']} blocks evicted")


def describe_warm_restart(report: dict) -> str:
    cold, warm = report["cold"], report["warm"]

    def ms(key: str) -> str:
        return f"{cold[key]:.0f} -> {warm[key]:.0f} ms"

    return (f"warm restart: {warm['kv_disk_hit_tokens']} prompt tokens loaded from the disk "
            f"tier (cold run {cold['kv_disk_hit_tokens']}); tokens computed "
            f"{cold['computed_tokens']} -> {warm['computed_tokens']} "
            f"({report['computed_tokens_saved']} saved); TTFT mean {ms('mean_ttft_ms')}, "
            f"p50 {ms('p50_ttft_ms')}, p99 {ms('p99_ttft_ms')}")
