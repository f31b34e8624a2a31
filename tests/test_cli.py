"""The `minivllm` command line: generate, bench throughput, and flag spelling."""

import re

import pytest

from minivllm.entrypoints.cli import main


def test_generate_prints_the_completion(stories_dir, capsys):
    assert main(["generate", "--model", str(stories_dir), "Once upon a time",
                 "--max-tokens", "8", "--num-kv-blocks", "64"]) == 0
    assert capsys.readouterr().out.strip() == "Once upon a time, there was a little girl"


def test_bench_throughput_reports_tokens_per_second(stories_dir, capsys):
    assert main(["bench", "throughput", "--model", str(stories_dir), "--num-prompts", "4",
                 "--input-len", "8", "--output-len", "4", "--num-kv-blocks", "64"]) == 0
    assert "output tok/s" in capsys.readouterr().out


def test_unknown_policy_lists_the_known_ones(stories_dir, capsys):
    assert main(["generate", "--model", str(stories_dir), "x", "--scheduling-policy",
                 "lottery", "--num-kv-blocks", "8"]) == 2
    assert re.search("fcfs.*priority.*sjf", capsys.readouterr().err)
    with pytest.raises(ValueError, match="fcfs.*priority.*sjf"):  # --debug: the traceback
        main(["generate", "--model", str(stories_dir), "x", "--scheduling-policy", "lottery",
              "--num-kv-blocks", "8", "--debug"])
