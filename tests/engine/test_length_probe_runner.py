"""The runner hands the `probe` length predictor the final-norm hidden state of each prompt's
last token when its prefill completes — whole, chunked, or after prefix-cache hits — equal
to transformers' last_hidden_state there; the oracle field is refused unless the engine runs
the oracle predictor."""

from __future__ import annotations

import json

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.engine.messages import make_core_request
from tests.model_factory import _load

PROMPTS = [[1] + [(11 * n + 5 * i) % 500 + 3 for i in range(n - 1)] for n in (3, 9, 40, 70)]


def hf_last_hidden(model_dir, prompt):
    with torch.no_grad():
        out = _load(model_dir).model(torch.tensor([prompt]))
    return out.last_hidden_state[0, -1].float().numpy()


@pytest.fixture(scope="module")
def probe_llm(tiny_llama):
    # 32 tokens a step: the 40- and 70-token prompts are prefilled in chunks
    return LLM(str(tiny_llama), block_size=4, num_kv_blocks=128, swap_space=0.001,
               max_num_batched_tokens=32, scheduling_policy="sjf", length_predictor="probe")


def test_prompt_hidden_equals_transformers_last_hidden_state(probe_llm, tiny_llama):
    predictor = probe_llm.llm_engine.core.scheduler.policy.predictor
    seen = {}
    observe = predictor.observe

    def spy(request):
        seen.setdefault(tuple(request.prompt_token_ids), []).append(request.prompt_hidden)
        observe(request)

    predictor.observe = spy
    try:
        params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
        batch = [{"prompt_token_ids": p} for p in PROMPTS]
        probe_llm.generate(batch, params, use_tqdm=False)
        probe_llm.generate(batch[2:], params, use_tqdm=False)  # prefix-cache hits this time
    finally:
        predictor.observe = observe
    assert probe_llm.llm_engine.core.scheduler.kv.prefix_cache_hits > 0
    for prompt in PROMPTS:
        rows = seen[tuple(prompt)]
        expected = hf_last_hidden(tiny_llama, prompt)
        for row in rows:
            assert row.shape == (64,) and row.dtype == expected.dtype
            assert abs(row - expected).max() < 1e-4
    assert predictor.ridge.n == 6


def test_no_hidden_state_unless_the_predictor_reads_it(tiny_llama):
    llm = LLM(str(tiny_llama), block_size=4, num_kv_blocks=64, swap_space=0.001,
              scheduling_policy="sjf")
    runner, core = llm.llm_engine.core.runner, llm.llm_engine.core
    results = []
    execute = runner.execute

    def spy(out):
        results.append(execute(out))
        return results[-1]

    runner.execute = spy
    llm.generate({"prompt_token_ids": PROMPTS[1]}, SamplingParams(max_tokens=2),
                 use_tqdm=False)
    assert results and not any(r.prompt_hidden for r in results)
    assert not core.scheduler.policy.predictor.needs_hidden_state


def test_oracle_field_only_with_the_oracle_predictor(tiny_llama, tmp_path):
    log = tmp_path / "predictions.jsonl"
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    plain = LLM(str(tiny_llama), block_size=4, num_kv_blocks=32, swap_space=0.001)
    with pytest.raises(ValueError, match="--length-predictor oracle"):
        plain.llm_engine.core.add_request(
            make_core_request("x", PROMPTS[0], params, oracle_output_len=5))
    lab = LLM(str(tiny_llama), block_size=4, num_kv_blocks=32, swap_space=0.001,
              scheduling_policy="sjf", length_predictor="oracle",
              length_prediction_log=str(log))
    engine = lab.llm_engine
    engine.add_request("y", make_core_request("y", PROMPTS[1], params, oracle_output_len=4),
                       params)
    while engine.has_unfinished_requests():
        engine.step()
    (row,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert row["predicted"] == 4 and row["output_tokens"] == 6
    assert row["predictor"] == "oracle" and row["prompt_tokens"] == len(PROMPTS[1])
    assert row["queue_s"] >= 0 and row["finish_reason"] == "length"
