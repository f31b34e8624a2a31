"""Data parallel without Ray: the metrics page with an `engine` label per replica, the summed
stats (the recompute tax's and edf's counters included), and `serve --data-parallel-size 2`
without ray installed (a clear message, exit 2)."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client import generate_latest

from minivllm.core.scheduler_stats import SchedulerStats, sum_stats
from minivllm.distributed.dp_metrics import DataParallelMetrics
from minivllm.engine.stats import IterationStats


def stats(running: int, free: int, hits: int) -> SchedulerStats:
    return SchedulerStats(num_running=running, num_total_blocks=100, num_free_blocks=free,
                          prefix_cache_queries=2 * hits, prefix_cache_hits=hits)


def test_sum_stats_adds_queues_and_weighs_kv_usage_by_blocks():
    total = sum_stats([stats(2, 90, 5), stats(3, 50, 7)])
    assert (total.num_running, total.num_total_blocks, total.prefix_cache_hits) == (5, 200, 12)
    assert abs(total.kv_cache_usage - 0.3) < 1e-12


def test_sum_stats_adds_the_recompute_tax_and_shed_counts():
    """What `get_stats` of a data-parallel server reports: every replica's counters, not
    only the queues (these were left at 0)."""
    a = SchedulerStats(num_recomputed_tokens=3, num_computed_tokens=40, num_requests_shed=1)
    b = SchedulerStats(num_recomputed_tokens=7, num_computed_tokens=60,
                       num_requests_deprioritized=2)
    total = sum_stats([a, b])
    assert (total.num_recomputed_tokens, total.num_computed_tokens) == (10, 100)
    assert (total.num_requests_shed, total.num_requests_deprioritized) == (1, 2)


def test_metrics_label_every_replica_and_count_the_router():
    m = DataParallelMetrics("demo", 512, 2, "cache_aware")
    m.record(stats(2, 90, 5), IterationStats(timestamp=0.0, num_prompt_tokens=10), engine_idx=0)
    m.record(stats(3, 50, 7), IterationStats(timestamp=0.0, num_generation_tokens=4), engine_idx=1)
    m.record_routed(1, 48)
    m.set_up(0, False)
    text = generate_latest(m.registry).decode()
    assert 'vllm:num_requests_running{engine="0",model_name="demo"} 2.0' in text
    assert 'vllm:num_requests_running{engine="1",model_name="demo"} 3.0' in text
    assert 'vllm:prefix_cache_hits_total{engine="1",model_name="demo"} 7.0' in text
    assert 'vllm:prompt_tokens_total{engine="0",model_name="demo"} 10.0' in text
    assert ('minivllm:router_requests_total{model_name="demo",policy="cache_aware",replica="1"} '
            '1.0') in text
    assert 'minivllm:router_prefix_hit_tokens_sum{model_name="demo",policy="cache_aware"} 48.0' \
        in text
    assert 'minivllm:replica_up{engine="0",model_name="demo"} 0.0' in text
    assert text.count("# TYPE vllm:num_requests_running gauge") == 1  # one family, two series


def test_stats_lines_per_replica_and_a_total(caplog):
    m = DataParallelMetrics("demo", 512, 2, "round_robin")
    m.record(stats(2, 90, 5), IterationStats(timestamp=0.0, num_generation_tokens=4), engine_idx=0)
    m.record(stats(3, 50, 7), IterationStats(timestamp=0.0, num_generation_tokens=4), engine_idx=1)
    with caplog.at_level("INFO", logger="minivllm.engine.stat_loggers"):
        m.log()
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(":")[0] for line in lines] == ["Engine 000", "Engine 001",
                                                      "Total (2 engines)"]
    assert "Running: 5 reqs" in lines[2] and "KV cache usage: 30.0%" in lines[2]


def test_data_parallel_without_ray_says_how_to_install_it(tmp_path):
    # ray may be installed here: hide it, as on a machine without the extra.
    code = ("import sys; sys.modules['ray'] = None; from minivllm.cli import main; "
            "sys.exit(main())")
    result = subprocess.run([sys.executable, "-c", code, "serve", "minivllm-demo",
                             "--data-parallel-size", "2"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    assert "pip install 'minivllm[ray]'" in result.stderr
