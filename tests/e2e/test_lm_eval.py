"""lm-eval, the harness most people evaluate served models with, runs docs/serving.md's command
against `minivllm serve` with no tokenizer argument (it finds /tokenizer_info and tokenizes
through the server), and its log-likelihoods equal transformers' on the same tokens to 1e-4."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minivllm.model.loader import resolve_model_path
from tests.readme_blocks import commands, readme_steps, with_port
from tests.server_utils import ServerProcess

pytestmark = pytest.mark.e2e  # make test-e2e (also run by CI), not make test

pytest.importorskip("lm_eval")
ROOT = Path(__file__).resolve().parents[2]


def _encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split of a request into context and continuation tokens (no special tokens;
    trailing spaces of the context move to the continuation)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    ctx = tokenizer.encode(context, add_special_tokens=False)
    return ctx, whole[len(ctx):]


def _transformers_loglikelihood(model, tokenizer, context: str, continuation: str) -> float:
    ctx, cont = _encode_pair(tokenizer, context, continuation)
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
    return sum(logprobs[len(ctx) + i - 1, t].item() for i, t in enumerate(cont))


def test_lm_eval_local_completions_matches_transformers(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    [step] = [s for s in readme_steps() if s.kind == "lm-eval"]
    [command] = [c for c in commands(step.code) if c.startswith("lm_eval ")]
    server = ServerProcess("minivllm-demo", ["--num-kv-blocks", "256", "--swap-space", "0.05",
                                             "--max-num-seqs", "8"], tmp_path / "server.log")
    try:
        env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
               "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]}
        out = tmp_path / "lm_eval"
        proc = subprocess.run(
            ["bash", "-c", with_port(command, server.port) +
             f" --output_path {out} --log_samples"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Using remote tokenizer backend" in proc.stderr  # no tokenizer= needed
    [samples_file] = out.rglob("samples_*.jsonl")
    [results_file] = out.rglob("results_*.json")
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    assert len(samples) >= 5

    path = resolve_model_path("minivllm-demo")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    correct = []
    for sample in samples:
        ours = [float(r[0][0]) for r in sample["resps"]]
        args = [sample["arguments"][f"gen_args_{i}"] for i in range(len(ours))]
        theirs = [_transformers_loglikelihood(model, tokenizer, a["arg_0"], a["arg_1"])
                  for a in args]
        assert ours == pytest.approx(theirs, abs=1e-4)
        correct.append(max(range(len(theirs)), key=theirs.__getitem__) == int(sample["target"]))
    [task] = json.loads(results_file.read_text())["results"].values()
    assert task["acc,none"] == pytest.approx(sum(correct) / len(correct), abs=1e-9)
