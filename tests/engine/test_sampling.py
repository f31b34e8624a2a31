"""Sampling parameters: validation, seeds, stops, penalties, logprobs."""

import pytest

from minivllm import LLM, SamplingParams
from tests.conftest import assert_all_blocks_free


@pytest.mark.parametrize("name, value", [
    ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("top_k", 0), ("top_k", -2),
    ("max_tokens", 0), ("min_p", 1.5), ("min_tokens", -1), ("n", 0), ("logprobs", -1),
    ("presence_penalty", 3.0), ("frequency_penalty", -3.0), ("repetition_penalty", 0.0),
    ("prompt_logprobs", -1), ("stop", [""]), ("stop_token_ids", [-5]), ("best_of", 0),
])
def test_invalid_parameter_raises_value_error_naming_it(name, value):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{name: value})


def test_min_tokens_above_max_tokens_is_rejected():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=5, max_tokens=2)


@pytest.fixture(scope="module")
def stories_llm(stories_dir):
    return LLM(str(stories_dir), num_kv_blocks=256, block_size=8)


PROMPT = "Once upon a time"


def test_seeded_sampling_is_independent_of_the_batch(stories_llm):
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=24)
    alone = stories_llm.generate(PROMPT, seeded, use_tqdm=False)[0].outputs[0].text
    others = [SamplingParams(temperature=1.0, max_tokens=30),
              SamplingParams(temperature=0.7, seed=7, max_tokens=10), seeded,
              SamplingParams(temperature=0, max_tokens=5)]
    batch = stories_llm.generate(["Tom had a dog", "The sun", PROMPT, "Lily"], others,
                                 use_tqdm=False)
    assert batch[2].outputs[0].text == alone
    other_seed = SamplingParams(temperature=0.9, top_p=0.95, seed=99, max_tokens=24)
    assert stories_llm.generate(PROMPT, other_seed, use_tqdm=False)[0].outputs[0].text != alone
    assert_all_blocks_free(stories_llm)


@pytest.mark.parametrize("include, expected", [
    (False, ", there was a little "), (True, ", there was a little girl na")])
def test_stop_string_spanning_tokens(stories_llm, include, expected):
    params = SamplingParams(temperature=0, max_tokens=32, stop=["girl na", "zzz"],
                            include_stop_str_in_output=include)
    completion = stories_llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert completion.text == expected
    assert completion.finish_reason == "stop"
    assert completion.stop_reason == "girl na"


def test_stop_token_ids_and_max_tokens(stories_llm):
    # 376 is " little" in the known greedy continuation.
    params = SamplingParams(temperature=0, max_tokens=32, stop_token_ids=[376])
    completion = stories_llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert completion.token_ids == [432, 383, 286, 261, 376]
    assert completion.finish_reason == "stop" and completion.stop_reason == 376
    params = SamplingParams(temperature=0, max_tokens=3)
    completion = stories_llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert len(completion.token_ids) == 3 and completion.finish_reason == "length"


def test_penalties_change_greedy_output_and_logprobs_report_rank(stories_llm):
    plain = SamplingParams(temperature=0, max_tokens=32, logprobs=3)
    penalised = SamplingParams(temperature=0, max_tokens=32, repetition_penalty=1.5,
                               frequency_penalty=0.5, presence_penalty=0.5)
    a, b = stories_llm.generate([PROMPT, PROMPT], [plain, penalised], use_tqdm=False)
    assert a.outputs[0].token_ids != b.outputs[0].token_ids
    for entry, token in zip(a.outputs[0].logprobs, a.outputs[0].token_ids):
        assert entry[token].rank == 1  # greedy picks the top token
        assert len(entry) == 3
    assert a.outputs[0].cumulative_logprob == pytest.approx(
        sum(e[t].logprob for e, t in zip(a.outputs[0].logprobs, a.outputs[0].token_ids)))


def test_top_k_one_equals_greedy_and_min_tokens_delays_eos(stories_llm):
    greedy = stories_llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=20),
                                  use_tqdm=False)[0].outputs[0].token_ids
    top1 = stories_llm.generate(PROMPT, SamplingParams(temperature=1.0, top_k=1, max_tokens=20),
                                use_tqdm=False)[0].outputs[0].token_ids
    assert top1 == greedy
    eos = stories_llm.get_tokenizer().eos_token_id
    params = SamplingParams(temperature=0, max_tokens=200, min_tokens=150)
    completion = stories_llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert len(completion.token_ids) >= 150
    assert eos not in completion.token_ids[:150]


def test_request_that_can_never_fit_is_rejected(stories_llm):
    with pytest.raises(ValueError, match="maximum context length is 512 tokens"):
        stories_llm.generate(PROMPT, SamplingParams(max_tokens=100_000), use_tqdm=False)
    assert_all_blocks_free(stories_llm)
