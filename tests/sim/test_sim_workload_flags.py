"""`sim` commands take every workload flag of `bench serve`, with the same meaning: one
workload command line replays through a server and through the simulator."""

from __future__ import annotations

import argparse
import json

import pytest

from minivllm.bench.args import workload_options
from minivllm.cli import build_parser, main

SIM_COMMANDS = ("serve", "policies", "plan")

# Every workload flag of bench serve, each with a value other than its default.
WORKLOAD_LINE = ["--workload", "random", "--seed", "3", "--prompt-seed", "4",
                 "--num-prompts", "9", "--dataset-name", "random", "--dataset-path", "p.jsonl",
                 "--start", "1",
                 "--time-scale", "0.5", "--request-rate", "7", "--burstiness", "2",
                 "--input-len", "40", "--output-len", "6", "--custom-output-len", "12",
                 "--disable-shuffle", "--length-scale", "0.5", "--output-ratio", "0.5",
                 "--priority", "user", "--max-concurrency", "3", "--endpoint", "chat",
                 "--backend", "openai-chat", "--prompt-mode", "text", "--no-ignore-eos",
                 "--stop-token-ids", "1", "2", "--request-seed", "5",
                 "--goodput", "ttft:500", "--output", "somewhere", "--disable-tqdm"]


def command(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def test_the_line_gives_every_bench_serve_workload_flag():
    """WORKLOAD_LINE covers bench serve's workload group, so the checks below see them all."""
    bench = workload_options(command("bench", "serve"))
    given = {a for a in WORKLOAD_LINE if a.startswith("--")}
    assert "--ignore-eos" in bench
    assert bench - {"--ignore-eos"} <= given | {"--no-ignore-eos"}


@pytest.mark.parametrize("sim", SIM_COMMANDS)
def test_sim_accepts_every_bench_serve_workload_flag(sim):
    bench, simulated = command("bench", "serve"), command("sim", sim)
    sim_options = {o for a in simulated._actions for o in a.option_strings}
    missing = workload_options(bench) - sim_options
    assert not missing, f"sim {sim} lacks bench serve's workload flags {sorted(missing)}"


@pytest.mark.parametrize("sim", SIM_COMMANDS)
def test_the_flags_parse_to_the_same_values(sim):
    dests = {a.dest for g in command("bench", "serve")._action_groups if g.title == "workload"
             for a in g._group_actions}
    bench = vars(command("bench", "serve").parse_args(WORKLOAD_LINE))
    simulated = vars(command("sim", sim).parse_args(WORKLOAD_LINE))
    assert {d: bench[d] for d in dests} == {d: simulated[d] for d in dests}


def _serve(tmp_path, name, *flags):
    out = tmp_path / name
    code = main(["sim", "serve", "--preset", "rtx4090-qwen2.5-7b", "--workload", "seed-low",
                 "--num-prompts", "8", "--disable-tqdm", "--output", str(out), *flags])
    return code, out


def test_ignore_eos_either_way_gives_the_trace_lengths(tmp_path):
    runs = {}
    for flag in ("--ignore-eos", "--no-ignore-eos"):
        code, out = _serve(tmp_path, flag, flag, "--prompt-seed", "7", "--request-seed", "1")
        assert code == 0
        doc = json.loads((out / "run.json").read_text())
        assert doc["meta"]["ignore_eos"] is (flag == "--ignore-eos")
        assert doc["meta"]["prompt_seed"] == 7 and doc["meta"]["request_seed"] == 1
        runs[flag] = [(r["output_tokens"], r["ttft"]) for r in doc["requests"]]
    assert runs["--ignore-eos"] == runs["--no-ignore-eos"]


def test_context_max_tokens_refuses_ignore_eos(tmp_path, capsys):
    code, _ = _serve(tmp_path, "ctx", "--request-max-tokens", "context", "--ignore-eos")
    assert code == 2
    assert "drop --ignore-eos" in capsys.readouterr().err
    code, out = _serve(tmp_path, "ctx2", "--request-max-tokens", "context")
    assert code == 0
    assert json.loads((out / "run.json").read_text())["meta"]["ignore_eos"] is False


def test_dataset_name_and_backend_resolve_as_in_bench(tmp_path, capsys):
    code, out = _serve(tmp_path, "ds", "--dataset-name", "random", "--backend", "openai-chat")
    assert code == 0
    meta = json.loads((out / "run.json").read_text())["meta"]
    assert meta["workload"].startswith("random") and meta["endpoint"] == "chat"
    code, _ = _serve(tmp_path, "bad", "--backend", "openai", "--endpoint", "chat")
    assert code == 2 and "contradicts" in capsys.readouterr().err
