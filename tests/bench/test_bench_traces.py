"""Real traces as workloads: the shared Azure and Mooncake samples load row for row, windows
and scales apply, Mooncake hash_ids become equal token blocks, bad rows name their line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from minivllm.bench.args import workload_spec
from minivllm.bench.prompts import prefix_blocks
from minivllm.bench.traces import (
    build_trace,
    read_azure,
    read_mooncake,
    symbolic_prompt,
    trace_from_file,
)

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
AZURE = TRACES / "azure-llm-2023-code.csv"
MOONCAKE = TRACES / "mooncake-synthetic.jsonl"


@pytest.fixture(autouse=True)
def _need_traces():
    if not AZURE.exists() or not MOONCAKE.exists():
        pytest.skip("../shared/traces is not present")


def test_azure_sample_round_trips():
    with open(AZURE, newline="") as f:
        raw = list(csv.DictReader(f))
    trace = build_trace(f"azure:{AZURE}")
    assert len(trace.entries) == len(raw) > 8000
    assert [e.prompt_tokens for e in trace.entries] == [int(r["ContextTokens"]) for r in raw]
    assert [e.output_tokens for e in trace.entries] == [max(2, int(r["GeneratedTokens"]))
                                                         for r in raw]
    first = trace.entries[:3]
    assert [e.send_time for e in first] == pytest.approx([0.0, 0.052, 0.098189], abs=1e-6)
    assert trace.entries[-1].send_time == pytest.approx(3435.948056, abs=1e-6)
    assert trace.length_scale == 1.0 and trace.prefix_block_tokens == 0


def test_mooncake_sample_round_trips():
    raw = [json.loads(line) for line in open(MOONCAKE)]
    trace = build_trace(f"mooncake:{MOONCAKE}")
    assert len(trace.entries) == len(raw) == 3993
    for e, r in zip(trace.entries, raw, strict=True):  # timestamps are sorted in the file
        assert (e.send_time, e.prompt_tokens, e.output_tokens, e.hash_ids) == (
            r["timestamp"] / 1000, r["input_length"], max(2, r["output_length"]),
            tuple(r["hash_ids"]))
    assert trace.prefix_block_tokens == 512


def test_window_and_scales():
    full = read_mooncake(MOONCAKE)
    trace = trace_from_file(f"mooncake:{MOONCAKE}", start=100, num_prompts=50, time_scale=0.5,
                            length_scale=0.25)
    assert len(trace.entries) == 50
    t0 = full[100][0]
    assert [e.send_time for e in trace.entries] == pytest.approx(
        [(t - t0) * 0.5 for t, *_ in full[100:150]])
    assert [e.prompt_tokens for e in trace.entries] == [max(1, round(p * 0.25))
                                                         for _, p, _, _ in full[100:150]]
    assert trace.prefix_block_tokens == 128
    assert trace.buckets == (125, 1250)
    capped = trace_from_file(f"azure:{AZURE}", num_prompts=20, max_model_len=512)
    assert capped.length_scale == 512 / 32768  # auto shrinks to the context as seed-* do
    assert all(e.prompt_tokens + e.output_tokens <= 512 for e in capped.entries)


def test_mooncake_hash_ids_become_equal_blocks():
    trace = trace_from_file(f"mooncake:{MOONCAKE}", num_prompts=400, length_scale=1 / 64)
    block, pool, cache = trace.prefix_block_tokens, np.arange(3, 200), {}
    seen: dict[str, dict[int, tuple]] = {"pool": {}, "symbolic": {}}
    reused = 0
    for i, entry in enumerate(trace.entries):
        prompts = {"pool": prefix_blocks(entry, block, pool, 0, cache),
                   "symbolic": symbolic_prompt(entry, i, block)}
        assert len(prompts["symbolic"]) == entry.prompt_tokens
        for name, ids in prompts.items():
            for k, h in enumerate(entry.hash_ids):
                chunk = tuple(ids[k * block:(k + 1) * block])
                if len(chunk) < block:
                    continue  # the prompt's last, partial block
                reused += name == "pool" and h in seen[name]
                assert seen[name].setdefault(h, chunk) == chunk
    assert reused > 100  # the sample reuses prefixes
    symbolic = seen["symbolic"].values()
    assert len(set(symbolic)) == len(seen["symbolic"])  # distinct ids, distinct blocks


@pytest.mark.parametrize("text, match", [
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1}\n',
     "line 2: missing field"),
    ('{"timestamp": 0, "input_length": "many", "output_length": 1}\n',
     "line 1: input_length must be an integer"),
    ('\n{"timestamp": -4, "input_length": 5, "output_length": 1}\n', "line 2: timestamp"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, "x"]}\n',
     "line 1: hash_ids"),
    ("[1, 2]\n", "line 1: expected a JSON object"),
    ("{oops\n", "line 1: not a JSON object"),
])
def test_malformed_mooncake_rows_name_the_line(tmp_path, text, match):
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_mooncake(path)


@pytest.mark.parametrize("text, match", [
    ("time,a,b\n", "line 1: expected the header"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,5,1\n"
     "2023-11-16 18:17:04,5\n", "line 3: expected 3 fields"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,1\n", "line 2: TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1.5,0,1\n", "line 2: ContextTokens must be >= 1"),
])
def test_malformed_azure_rows_name_the_line(tmp_path, text, match):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_azure(path)


def test_any_file_of_the_format_loads(tmp_path):
    path = tmp_path / "week.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2024-05-10 00:00:00,100,10\n2024-05-10 00:00:01.5,200,20\n")
    trace = build_trace(f"azure:{path}")
    assert [(e.send_time, e.prompt_tokens) for e in trace.entries] == [(0.0, 100), (1.5, 200)]


def test_workload_flag_checks_the_file():
    assert workload_spec("seed-high") == "seed-high"
    assert workload_spec(f"azure:{AZURE}") == f"azure:{AZURE}"
    for bad in ("azure:/no/such/file.csv", "zipf", "mooncake:"):
        with pytest.raises(Exception, match="no such file|unknown workload|needs a file"):
            workload_spec(bad)
