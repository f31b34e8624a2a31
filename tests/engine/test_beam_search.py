"""LLM.beam_search on stories260K: the same hypotheses and scores as transformers'
generate(num_beams=k) for k = 2 and 4 under each early_stopping mode; the beams of a step
share the prompt's KV blocks (prefix-cache hits, ref-counted); no block is left held, for
random beam widths, prompts and lengths under KV pressure; bad parameters name their field.
(The EOS rules are exercised on SmolLM2, tests/model/test_real_beam_search.py: stories260K
ends no beam within these lengths.)"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm import LLM
from minivllm.sampling_params import BeamSearchParams
from tests.beam_reference import assert_same_hypotheses, hf_beam_search, minivllm_hypotheses
from tests.conftest import assert_all_blocks_free


@pytest.fixture(scope="module")
def llm(stories_dir):
    return LLM(str(stories_dir), dtype="float32")


@pytest.fixture(scope="module")
def small_cache_llm(stories_dir):
    """8 blocks of 16 tokens: 3 prompts x 4 beams cannot all hold their blocks at once."""
    return LLM(str(stories_dir), dtype="float32", num_kv_blocks=8, swap_space=0.001)


@pytest.fixture(scope="module")
def hf_model(stories_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(stories_dir, dtype=torch.float32).eval()


@pytest.mark.parametrize("beam_width", [2, 4])
@pytest.mark.parametrize("length_penalty,early_stopping,max_tokens",
                         [(1.0, False, 24), (0.5, True, 40), (1.5, "never", 40)])
def test_beam_search_equals_transformers(llm, hf_model, beam_width, length_penalty,
                                         early_stopping, max_tokens):
    eos = sorted(llm.llm_engine.core.eos_token_ids)
    for text in ["Once upon a time", "Lily and Ben went to the park. They"]:
        ids = llm.get_tokenizer()(text).input_ids
        params = BeamSearchParams(beam_width, max_tokens, length_penalty=length_penalty,
                                  early_stopping=early_stopping)
        output = llm.beam_search({"prompt_token_ids": ids}, params)[0]
        assert len(output.sequences) == beam_width
        assert all(s.finish_reason == "length" for s in output.sequences)
        assert output.sequences[0].text.startswith(llm.get_tokenizer().decode(ids))
        assert_same_hypotheses(
            minivllm_hypotheses(output, len(ids), length_penalty),
            hf_beam_search(hf_model, ids, beam_width, max_tokens, length_penalty,
                           early_stopping, eos))
    assert_all_blocks_free(llm)


def test_beams_share_the_prompts_blocks(llm, monkeypatch):
    """Every step after the first runs k requests whose first blocks (the prompt's full
    ones, cached by the step before) are the same physical blocks, held k times."""
    scheduler = llm.llm_engine.scheduler
    shared_steps = []
    update = scheduler.update_from_output

    def inspect(*args, **kwargs):
        tables = [r.block_ids for r in scheduler.running]
        if len(tables) == 3:
            first = {t[0] for t in tables} | {t[1] for t in tables}
            shared_steps.append((len(first), [scheduler.kv.blocks[b].ref_cnt for b in first]))
        return update(*args, **kwargs)

    monkeypatch.setattr(scheduler, "update_from_output", inspect)
    ids = list(range(5, 45))  # 40 tokens: two full blocks of 16
    llm.beam_search({"prompt_token_ids": ids}, BeamSearchParams(3, 6))
    assert len(shared_steps) == 5  # steps 2..6 run the 3 beams together
    assert all(step == (2, [3, 3]) for step in shared_steps), shared_steps


@settings(max_examples=12, deadline=None)
@given(beam_width=st.integers(1, 4), max_tokens=st.integers(1, 10),
       prompts=st.lists(st.lists(st.integers(3, 511), min_size=1, max_size=30),
                        min_size=1, max_size=3))
def test_no_block_leaks(small_cache_llm, beam_width, max_tokens, prompts):
    outputs = small_cache_llm.beam_search([{"prompt_token_ids": p} for p in prompts],
                                          BeamSearchParams(beam_width, max_tokens))
    for prompt, output in zip(prompts, outputs):
        assert len(output.sequences) == beam_width
        assert all(len(s.tokens) == len(prompt) + max_tokens for s in output.sequences)
    assert_all_blocks_free(small_cache_llm)
    assert all(meta.ref_cnt == 0 for meta in small_cache_llm.llm_engine.scheduler.kv.blocks)


@pytest.mark.parametrize("kwargs,field", [
    ({"beam_width": 0, "max_tokens": 4}, "beam_width"),
    ({"beam_width": 2, "max_tokens": 0}, "max_tokens"),
    ({"beam_width": 2, "max_tokens": 4, "temperature": 0.7}, "temperature"),
    ({"beam_width": 2, "max_tokens": 4, "early_stopping": "sometimes"}, "early_stopping"),
])
def test_bad_params_name_their_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BeamSearchParams(**kwargs)


def test_limits_name_their_field(llm):
    with pytest.raises(ValueError, match="beam_width"):  # 2 * 11 logprobs > max_logprobs 20
        llm.beam_search("Once", BeamSearchParams(11, 4))
    with pytest.raises(ValueError, match="max_tokens"):
        llm.beam_search("Once", BeamSearchParams(2, llm.llm_engine.max_model_len))
