"""Greedy output token-identical to transformers, for every architecture, with and
without recompute preemption; logprobs within 1e-4; the real stories260K continuation."""

import pytest

from minivllm import LLM, SamplingParams
from tests.conftest import assert_all_blocks_free
from tests.model_factory import CONFIGS, hf_greedy, hf_greedy_batch, hf_prompt_logprobs

PROMPT_LENGTHS = [3, 5, 8, 13, 21, 34, 55, 70]
MAX_TOKENS = 12


def _prompts():
    return [[1] + [(7 * n + 13 * i) % 500 + 3 for i in range(n - 1)] for n in PROMPT_LENGTHS]


class _References(dict):
    """transformers' greedy tokens and logprobs per architecture, computed on first use."""

    def __init__(self, model_dirs) -> None:
        super().__init__()
        self.model_dirs = model_dirs

    def __missing__(self, kind: str):
        self[kind] = hf_greedy_batch(self.model_dirs[kind], _prompts(), MAX_TOKENS)
        return self[kind]


@pytest.fixture(scope="module")
def references(tiny_model_dirs):
    return _References(tiny_model_dirs)


@pytest.mark.parametrize("kind", list(CONFIGS))
@pytest.mark.parametrize("num_kv_blocks", [None, 24])
def test_greedy_matches_transformers(kind, num_kv_blocks, tiny_model_dirs, references):
    llm = LLM(str(tiny_model_dirs[kind]), block_size=4, num_kv_blocks=num_kv_blocks or 256,
              swap_space=0.001)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in _prompts()], params, use_tqdm=False)
    for output, (ref_tokens, ref_logprobs) in zip(outputs, references[kind]):
        completion = output.outputs[0]
        assert completion.token_ids == ref_tokens
        assert completion.finish_reason == "length"
        got = [entry[t].logprob for entry, t in zip(completion.logprobs, completion.token_ids)]
        assert got == pytest.approx(ref_logprobs, abs=1e-4)
    if num_kv_blocks:  # 24 blocks of 4 tokens cannot hold the batch: preemption happened
        assert llm.stats().num_preemptions > 0
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("preemption_mode", ["swap", "recompute"])
def test_greedy_matches_transformers_with_prefix_hits(preemption_mode, tiny_llama):
    """Prompts sharing a long prefix, sent in two waves so that the second is served from
    the prefix cache, in a cache small enough to preempt: still transformers' tokens."""
    prefix = _prompts()[-1][:41]
    prompts = [prefix + [(31 * k + 7 * i) % 500 + 3 for i in range(2 + 3 * k)]
               for k in range(6)]
    expected = [hf_greedy(tiny_llama, p, MAX_TOKENS)[0] for p in prompts]
    llm = LLM(str(tiny_llama), block_size=4, num_kv_blocks=24, swap_space=0.001,
              preemption_mode=preemption_mode, max_num_batched_tokens=32)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    first = llm.generate({"prompt_token_ids": prompts[0]}, params, use_tqdm=False)
    rest = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in first + rest] == expected
    assert all(o.num_cached_tokens >= 40 for o in rest)  # the shared prefix was a hit
    assert llm.stats().num_preemptions > 0
    assert_all_blocks_free(llm)


def test_prompt_logprobs_match_transformers(tiny_llama):
    llm = LLM(str(tiny_llama), block_size=4, num_kv_blocks=64, max_num_batched_tokens=8)
    prompt = _prompts()[5]
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2)
    output = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    assert output.prompt_logprobs[0] is None
    got = [entry[t].logprob for entry, t in zip(output.prompt_logprobs[1:], prompt[1:])]
    assert got == pytest.approx(hf_prompt_logprobs(tiny_llama, prompt), abs=1e-4)
    assert all(len(entry) >= 2 for entry in output.prompt_logprobs[1:])
    assert_all_blocks_free(llm)


def test_stories260k_known_continuation(stories_dir):
    llm = LLM(str(stories_dir), num_kv_blocks=64)
    output = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=32),
                          use_tqdm=False)[0]
    assert output.prompt_token_ids == [1, 403, 407, 261, 378]
    assert output.outputs[0].token_ids == [
        432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410,
        408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394]
    assert output.outputs[0].text == (
        ", there was a little girl named Lily. She loved to play outside in the park. "
        "One day, she saw")
    metrics = output.metrics
    assert metrics.arrival_time <= metrics.first_scheduled_time <= metrics.first_token_time
    assert metrics.first_token_time <= metrics.finished_time
    assert_all_blocks_free(llm)


def test_unsupported_architecture_lists_supported(tmp_path, tiny_llama):
    import json
    import shutil

    shutil.copytree(tiny_llama, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="LlamaForCausalLM.*Qwen2ForCausalLM"):
        LLM(str(tmp_path / "m"), num_kv_blocks=8)
