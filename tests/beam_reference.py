"""transformers' beam search, the reference minivllm's LLM.beam_search must equal: one
prompt's num_return_sequences = num_beams hypotheses as (generated token ids, score), best
first. The generation config is built here whole, so that nothing of the model's own
(sampling fields, a repetition penalty) changes the search."""

from __future__ import annotations

import torch


def hf_beam_search(model, prompt_ids: list[int], beam_width: int, max_tokens: int,
                   length_penalty: float, early_stopping: bool | str,
                   eos_token_ids: list[int]) -> list[tuple[list[int], float]]:
    from transformers import GenerationConfig

    config = GenerationConfig(
        num_beams=beam_width, num_return_sequences=beam_width, do_sample=False,
        max_new_tokens=max_tokens, length_penalty=length_penalty,
        early_stopping=early_stopping, eos_token_id=eos_token_ids,
        pad_token_id=eos_token_ids[0])
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), generation_config=config,
                             return_dict_in_generate=True, output_scores=True)
    hypotheses = []
    for row, score in zip(out.sequences[:, len(prompt_ids):].tolist(),
                          out.sequences_scores.tolist()):
        # the generated tokens up to the first EOS, included (padding follows it)
        end = next((i + 1 for i, t in enumerate(row) if t in eos_token_ids), len(row))
        hypotheses.append((row[:end], score))
    return hypotheses


def minivllm_hypotheses(output, prompt_len: int, length_penalty: float
                        ) -> list[tuple[list[int], float]]:
    """An LLM.beam_search output as the same pairs: the score is transformers'."""
    return [(s.tokens[prompt_len:],
             s.cum_logprob / len(s.tokens[prompt_len:]) ** length_penalty)
            for s in output.sequences]


def assert_same_hypotheses(ours, theirs, tol: float = 1e-3) -> None:
    assert [tokens for tokens, _ in ours] == [tokens for tokens, _ in theirs]
    for (_, a), (_, b) in zip(ours, theirs):
        assert abs(a - b) < tol, (a, b)
