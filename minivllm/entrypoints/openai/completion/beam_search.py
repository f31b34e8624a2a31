"""POST /v1/completions with use_beam_search (vLLM's extra field): n is the beam width,
each prompt's n hypotheses are its n choices, best first (index i * n + j). The search is
minivllm/beam_search.py's, driven here one step at a time: each live beam of every prompt
is one engine request of one token, all of a step in flight at once; they share KV blocks
through the prefix cache (docs/beam-search.md). Whole answers only."""

from __future__ import annotations

import functools

from minivllm.beam_search import BeamSearch, advance_all, check_beam_search, step_params
from minivllm.engine.core import eos_token_ids
from minivllm.entrypoints.openai.completion.protocol import CompletionChoice, CompletionRequest
from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.protocol import UsageInfo
from minivllm.entrypoints.openai.serving import OpenAIServing
from minivllm.entrypoints.openai.streaming import gather_or_cancel, last_output
from minivllm.model.loader import resolve_model_path
from minivllm.sampling_params import BeamSearchParams


@functools.cache
def _eos_ids(serving: OpenAIServing) -> frozenset[int]:
    """The engine core's EOS ids, read once from the same files it read them from."""
    model = serving.engine.config.model_config
    path = resolve_model_path(model.model, model.revision)
    return frozenset(eos_token_ids(path, serving.tokenizer))


def beam_search_params(serving: OpenAIServing, req: CompletionRequest,
                       prompts: list[tuple[str | None, list[int]]]) -> BeamSearchParams:
    """The request's search, or a 400 naming the field that cannot be searched with."""
    for field, unsupported in (("stream", req.stream), ("best_of", req.best_of is not None),
                               ("logprobs", req.logprobs is not None), ("echo", req.echo)):
        if unsupported:
            raise OpenAIError(f"{field}: not supported with use_beam_search", 400, field)
    if req.temperature not in (None, 0.0):
        raise OpenAIError(f"temperature: use_beam_search needs temperature 0 (sampled beam "
                          f"search is not supported), got {req.temperature}", 400,
                          "temperature")
    serving.check_limit("n", req.n, "max_n")
    max_tokens = req.max_tokens
    if max_tokens is None:  # the rest of the context, after the longest prompt
        max_tokens = serving.max_model_len - max(len(ids) for _, ids in prompts)
    try:
        params = BeamSearchParams(beam_width=req.n, max_tokens=max_tokens,
                                  ignore_eos=req.ignore_eos, length_penalty=req.length_penalty,
                                  early_stopping=req.early_stopping)
        for _, ids in prompts:
            check_beam_search(params, _eos_ids(serving), serving.engine.config.max_logprobs,
                              len(ids), serving.max_model_len)
    except ValueError as e:
        field = str(e).split()[0].rstrip(":")
        raise OpenAIError(str(e).replace("beam_width", "n"), 400,
                          "n" if field == "beam_width" else field) from e
    return params


async def beam_search_choices(serving: OpenAIServing, req: CompletionRequest, request_id: str,
                              prompts: list[tuple[str | None, list[int]]],
                              params: BeamSearchParams
                              ) -> tuple[list[CompletionChoice], UsageInfo]:
    searches = [BeamSearch(ids, params, _eos_ids(serving)) for _, ids in prompts]
    step = step_params(searches[0].num_candidates)
    cached = num_steps = 0
    while live := [s for s in searches if not s.done]:
        beams = [ids for s in live for ids in s.beam_token_ids()]
        outputs = await gather_or_cancel(
            last_output(serving.generate(f"{request_id}-{num_steps}-{b}", None, ids, step, req))
            for b, ids in enumerate(beams))
        if num_steps == 0:  # the prompts' own hits; later steps hit the beams' blocks
            cached = sum(o.num_cached_tokens for o in outputs)
        advance_all(live, outputs)
        num_steps += 1
    choices, completion_tokens = [], 0
    for i, ((_, prompt_ids), search) in enumerate(zip(prompts, searches)):
        for j, sequence in enumerate(search.best()):
            generated = sequence.tokens[len(prompt_ids):]
            completion_tokens += len(generated)
            choices.append(CompletionChoice(
                index=i * req.n + j, finish_reason=sequence.finish_reason,
                text=serving.tokenizer.decode(generated,
                                              skip_special_tokens=req.skip_special_tokens),
                **({"token_ids": generated, "prompt_token_ids": prompt_ids}
                   if req.return_token_ids else {})))
    usage = UsageInfo.count(sum(len(ids) for _, ids in prompts), completion_tokens, cached)
    return choices, usage
