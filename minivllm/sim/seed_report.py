"""The seed report's section 3.2 (../shared/seeds/vllm-scheduler-lab-report.txt): seed-high on
an RTX 4090, Qwen2.5-7B-Instruct, vLLM 0.6.4, full lengths. Its "TPOT (token/s)" is output
tokens / end-to-end time of a request, our "output/E2E (tok/s)"."""

from __future__ import annotations

from minivllm.bench.metrics import BUCKETS

# bucket -> policy -> (requests, mean prompt tokens, TTFT s, output/E2E tokens/s)
REPORT_3_2 = {
    "short": {"fcfs": (30, 101.0, 6.327, 33.379), "priority": (22, 100.5, 16.147, 30.865),
              "sjf": (18, 104.0, 3.379, 42.497)},
    "medium": {"fcfs": (79, 2900.6, 12.487, 31.832), "priority": (111, 3231.5, 14.009, 28.850),
               "sjf": (94, 2887.5, 3.641, 39.338)},
    "long": {"fcfs": (113, 10921.8, 16.212, 27.544), "priority": (136, 11365.1, 18.983, 25.186),
             "sjf": (153, 11235.1, 19.299, 23.339)},
}


def side_by_side(summaries: dict[str, dict], label: str) -> str:
    """Our per-bucket means beside the report's, for the policies both have."""
    lines = [f"## Beside the seed report's section 3.2 (ours: {label})", "",
             "| bucket | policy | requests (ours / report) | mean prompt (ours / report) "
             "| TTFT s (ours / report) | output/E2E tok/s (ours / report) |",
             "|---|---|---|---|---|---|"]
    for bucket in BUCKETS:
        for policy, s in summaries.items():
            theirs = REPORT_3_2[bucket].get(policy)
            if theirs is None:
                continue
            b = s["buckets"][bucket]
            ttft = b["ttft_ms"]["mean"]
            rate = b["output_tokens_per_s"]["mean"]
            prompt = b["mean_prompt_tokens"]
            lines.append(
                f"| {bucket} | {policy} | {b['requests']} / {theirs[0]} | "
                f"{'-' if prompt is None else f'{prompt:.0f}'} / {theirs[1]:.0f} | "
                f"{'-' if ttft is None else f'{ttft / 1000:.2f}'} / {theirs[2]:.2f} | "
                f"{'-' if rate is None else f'{rate:.1f}'} / {theirs[3]:.1f} |")
    return "\n".join(lines) + "\n"
