"""The `minivllm` command line: generate, bench throughput, and flag spelling."""

import re

import pytest

from minivllm.cli import main


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


# Every engine flag with its default and type, as they were before EngineConfig had sections.
ENGINE_FLAGS = {
    "--model": ("minivllm-demo", str), "--tokenizer": (None, str),
    "--served-model-name": (None, str), "--dtype": ("auto", str), "--quantization": (None, str),
    "--device": ("auto", str), "--seed": (0, int), "--revision": (None, str),
    "--block-size": (16, int), "--num-kv-blocks": (None, int), "--kv-cache-space": (None, float),
    "--swap-space": (4.0, float), "--kv-cache-dtype": ("auto", str),
    "--kv-offloading-backend": (None, str), "--kv-offloading-path": (None, str),
    "--kv-offloading-size": (4.0, float),
    "--kv-transfer-config": (None, "json"),
    "--enable-prefix-caching": (True, None), "--max-num-seqs": (256, int),
    "--max-num-batched-tokens": (None, int), "--max-model-len": (None, int),
    "--enable-chunked-prefill": (True, None), "--long-prefill-token-threshold": (0, int),
    "--long-prefill-token-threshold-adaptive": (False, None),
    "--max-num-partial-prefills": (None, int), "--max-long-partial-prefills": (None, int),
    "--target-tpot-ms": (None, float),
    "--speculative-config": (None, "json"),
    "--scheduling-policy": ("fcfs", str),
    "--length-predictor": ("mean", str), "--length-prediction-log": (None, str),
    "--preemption-mode": (None, str), "--priority-aging-s": (10.0, float),
    "--active-preemption": (False, None), "--min-run-quantum": (8, int),
    "--preemption-victim": ("lowest_rank", str), "--vtc-weights": ("1,2", str),
    "--vtc-tenant-weights": (None, str),
    "--edf-action": ("shed", str), "--ttft-slo-ms": (None, float),
    "--e2e-slo-ms": (None, float), "--mlfq-base-quantum": (4, int), "--residual-sjf-max-wait-ms": (10000.0, float),
    "--max-num-waiting-requests": (None, int), "--max-num-waiting-tokens": (None, int),
    "--request-timeout": (None, float), "--max-loras": (1, int), "--max-logprobs": (20, int),
    "--enable-lora": (False, None), "--max-lora-rank": (16, int), "--max-cpu-loras": (None, int),
    "--num-threads": (None, int), "--generation-config": ("auto", str),
    "--override-generation-config": (None, "json"),
    "--pooler-config": (None, "json"), "--runner": ("auto", str), "--convert": ("auto", str),
    "--kernel-choice": ("auto", str),
}


def test_engine_flags_keep_their_names_defaults_and_types():
    import argparse

    from minivllm.entrypoints.engine_args import JSON_FLAGS, add_engine_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    flags = {a.option_strings[0]: (a.default, "json" if a.type in JSON_FLAGS.values() else a.type)
             for a in parser._actions if a.dest != "help"}
    assert flags == ENGINE_FLAGS



def test_speculative_config_flag_checks_its_json(capsys):
    import argparse

    import pytest

    from minivllm.entrypoints.engine_args import add_engine_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--speculative-config", '{"num_speculative_tokens": 5}'])
    assert args.speculative_config["method"] == "ngram"
    assert args.speculative_config["num_speculative_tokens"] == 5
    with pytest.raises(SystemExit):
        parser.parse_args(["--speculative-config", '{"method": "ngram", "k": 3}'])
    assert "unknown key(s) 'k'" in capsys.readouterr().err
