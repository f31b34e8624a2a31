"""POST /completion and /infill, llama-server's way, over the OpenAI serving objects' checks,
sampling parameters and engine call: one engine request per prompt, answered whole (a list
for several prompts) or as server-sent events (`data: {...}` lines, no [DONE])."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import Response
from fastapi.responses import JSONResponse

from minivllm.entrypoints.llamacpp.answers import chosen_fields, final_answer, token_event
from minivllm.entrypoints.llamacpp.errors import error_json
from minivllm.entrypoints.llamacpp.fim import FimTokens, infill_prompt
from minivllm.entrypoints.llamacpp.progress import Progress
from minivllm.entrypoints.llamacpp.protocol import (
    DEFAULT_SEED,
    CompletionRequest,
    InfillRequest,
)
from minivllm.entrypoints.llamacpp.slots import next_seats
from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.protocol import SamplingRequest
from minivllm.entrypoints.openai.serving import OpenAIServing
from minivllm.entrypoints.openai.streaming import SSEResponse, first_outputs, merge_streams
from minivllm.outputs import RequestOutput

# minivllm's names for llama-server's, in the messages of the checks they share
_RENAMES = {"repetition_penalty": "repeat_penalty", "max_tokens": "n_predict"}
# Samplers minivllm does not run: field -> its disabled value (any other is refused)
_UNSUPPORTED = {"typical_p": 1.0, "mirostat": 0, "dry_multiplier": 0.0,
                "xtc_probability": 0.0, "dynatemp_range": 0.0, "grammar": "",
                "post_sampling_probs": False}
_UNSUPPORTED_EMPTY = ("logit_bias",)  # refused unless empty


class LlamaServing:
    def __init__(self, base: OpenAIServing, fim: FimTokens, eog_ids: list[int],
                 max_num_seqs: int) -> None:
        self.base = base
        self.fim = fim
        self.eog_ids = eog_ids  # the end-of-generation tokens besides EOS (fim.py)
        self.max_num_seqs = max_num_seqs

    # ---- prompts ------------------------------------------------------------------------

    def _prompts(self, prompt) -> list[list[int]]:
        """`prompt`'s shapes as token id lists: a string, ids, ids and strings mixed, or a
        list of those (a list of strings only is several prompts, as llama-server reads it)."""
        if isinstance(prompt, str) or any(isinstance(p, int) for p in prompt):
            prompt = [prompt]
        if not prompt:
            raise OpenAIError("prompt must not be empty", 400, "prompt")
        self.base.check_limit("prompt", len(prompt), "max_prompts_per_request")
        return [self._tokenize(p) for p in prompt]

    def _tokenize(self, prompt: str | list) -> list[int]:
        parts = [prompt] if isinstance(prompt, str) else prompt
        ids: list[int] = []
        for i, part in enumerate(parts):
            if isinstance(part, str):  # BOS (if the model's) only before a leading text
                ids += self.base.encode(part, "prompt", add_special_tokens=i == 0)
            else:
                ids.append(part)
        self.base.check_token_ids(ids, "prompt")
        return ids

    def _infill_ids(self, req: InfillRequest) -> list[int]:
        try:
            self.fim.check("input_prefix")
        except ValueError as e:
            raise OpenAIError(str(e), 400, "input_prefix") from e
        for name, text in (("input_prefix", req.input_prefix),
                           ("input_suffix", req.input_suffix), ("prompt", req.prompt),
                           *(("input_extra", c.text + c.filename) for c in req.input_extra)):
            try:
                text.encode()
            except UnicodeEncodeError as e:  # a lone surrogate ("\ud800" in JSON)
                raise OpenAIError(f"{name}: not valid Unicode ({e.reason})", 400, name) from e
        return infill_prompt(self.base.tokenizer, self.fim, req.input_prefix,
                             req.input_suffix, [(c.filename, c.text) for c in req.input_extra],
                             req.prompt, self.base.max_model_len, req.n_predict)

    # ---- sampling -----------------------------------------------------------------------

    def _sampling(self, req: CompletionRequest, num_prompt_tokens: int):
        """The request's SamplingRequest (what generate() reads) and SamplingParams for a
        prompt of that length: n_predict past the context's end stops there, as in
        llama-server (`truncated`), instead of being refused."""
        for field, disabled in _UNSUPPORTED.items():
            if getattr(req, field) != disabled:
                raise OpenAIError(f"{field}: minivllm does not run this sampler (only "
                                  f"{json.dumps(disabled)} is accepted)", 400, field)
        for field in _UNSUPPORTED_EMPTY:
            if getattr(req, field):
                raise OpenAIError(f"{field}: not supported by minivllm's llama-server API "
                                  "(only empty is accepted)", 400, field)
        self.base.check_context(num_prompt_tokens, None, "prompt")
        sreq = SamplingRequest(
            temperature=max(req.temperature, 0.0), top_k=req.top_k if req.top_k > 0 else -1,
            top_p=req.top_p, min_p=req.min_p, repetition_penalty=req.repeat_penalty,
            presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
            stop=req.stop, seed=None if req.seed in (-1, DEFAULT_SEED) else req.seed,
            stream=True, ignore_eos=req.ignore_eos,  # deltas, whole answers too (_events)
            # llama.cpp's ignore_eos lets every end-of-generation token through
            stop_token_ids=[] if req.ignore_eos else self.eog_ids,
            guided_json=req.json_schema)
        # None: the rest of the context. n_predict 0 evaluates the prompt only: the engine
        # generates one token, which is dropped.
        room = self.base.max_model_len - num_prompt_tokens
        max_tokens = None if req.n_predict == -1 or req.n_predict >= room \
            else max(req.n_predict, 1)
        try:
            params = self.base.sampling_params(sreq, max_tokens, req.n_probs or None,
                                               logprobs_param="n_probs")
        except OpenAIError as e:
            for ours, theirs in _RENAMES.items():
                e.message = e.message.replace(ours, theirs)
                e.param = theirs if e.param == ours else e.param
            raise
        return sreq, params

    # ---- endpoints ----------------------------------------------------------------------

    async def completion(self, req: CompletionRequest) -> Response:
        return await self._serve(req, self._prompts(req.prompt), "cmpl")

    async def infill(self, req: InfillRequest) -> Response:
        return await self._serve(req, [self._infill_ids(req)], "infill")

    async def _serve(self, req: CompletionRequest, prompts: list[list[int]], kind: str
                     ) -> Response:
        sampling = [self._sampling(req, len(ids)) for ids in prompts]
        request_id = f"{kind}-{uuid.uuid4().hex}"
        seats = next_seats(self.base.engine, len(prompts), self.max_num_seqs)
        gens = [self.base.generate(f"{request_id}-{i}", None, ids, params, sreq)
                for i, (ids, (sreq, params)) in enumerate(zip(prompts, sampling))]
        firsts = await first_outputs(gens)  # the engine's refusals: a 4xx, not a stream
        events = self._events(req, gens, firsts, seats)
        if req.stream:
            return SSEResponse(_sse_events(events, req.response_fields))
        async with aclosing(events):  # left early (a disconnect): the requests are aborted
            finals = [(i, event) async for last, i, event in events if last]
        finals = [chosen_fields(event, req.response_fields) for _, event in sorted(
            finals, key=lambda item: item[0])]
        return JSONResponse(finals[0] if len(finals) == 1 else finals)

    async def _events(self, req: CompletionRequest, gens, firsts, seats
                      ) -> AsyncIterator[tuple[bool, int, dict]]:
        """(last, prompt index, event): each request's token events (what a stream sends)
        and its last answer. The engine streams deltas, which n_indent reads as they come,
        whole answers too."""
        progress = [Progress(req.n_indent) for _ in gens]
        async with aclosing(merge_streams(gens, firsts)) as stream:
            async for i, out in stream:
                for event in self._on_output(req, i, seats[i], out, progress[i]):
                    yield event
                if progress[i].cut and len(gens) == 1:
                    return  # closing the stream aborts the request

    def _on_output(self, req: CompletionRequest, i: int, seat: int, out: RequestOutput,
                   p: Progress) -> list[tuple[bool, int, dict]]:
        events = []
        if p.cut:  # ended early; with several prompts, the others go on
            return events
        if req.n_predict != 0:  # 0: the one token the engine had to generate is dropped
            p.add(out.outputs[0])
        m = out.metrics
        if (req.t_max_predict_ms and "\n" in p.text and m is not None and m.first_token_time
                and m.last_token_time is not None and (m.last_token_time - m.first_token_time)
                * 1e3 > req.t_max_predict_ms):
            p.cut = True  # llama-server's time limit, measured from the first token
        text, token_ids, steps = p.unsent()
        if text or token_ids:
            events.append((False, i, token_event(self.base, req, i, seat, out, p, text,
                                                 token_ids, steps)))
        if out.finished or p.cut:
            events.append((True, i, final_answer(self.base, req, i, seat, out, p)))
        return events


async def _sse_events(events: AsyncIterator[tuple[bool, int, dict]],
                      response_fields: list[str]) -> AsyncIterator[str]:
    """A stream's events; whatever fails after it started, it ends with an error event."""
    async with aclosing(events):
        try:
            async for last, _, event in events:
                yield _sse(chosen_fields(event, response_fields) if last else event)
        except Exception as e:
            yield _sse(error_json(e)[0])


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
