"""POST /completion and /infill, llama-server's way, over the OpenAI serving objects' checks,
sampling parameters and engine call: one engine request per prompt, answered whole (a list
for several prompts) or as server-sent events (`data: {...}` lines, no [DONE])."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

from fastapi import Response
from fastapi.responses import JSONResponse

from minivllm.entrypoints.llamacpp.errors import error_json
from minivllm.entrypoints.llamacpp.fim import FimTokens, infill_prompt
from minivllm.entrypoints.llamacpp.pieces import token_bytes
from minivllm.entrypoints.llamacpp.protocol import (
    DEFAULT_SEED,
    CompletionRequest,
    InfillRequest,
)
from minivllm.entrypoints.llamacpp.settings import settings
from minivllm.entrypoints.llamacpp.slots import next_seats
from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.protocol import SamplingRequest
from minivllm.entrypoints.openai.serving import LOGPROB_FLOOR, OpenAIServing
from minivllm.entrypoints.openai.streaming import (
    SSEResponse,
    first_outputs,
    gather_or_cancel,
    last_output,
    merge_streams,
)
from minivllm.outputs import Logprob, RequestOutput

# minivllm's names for llama-server's, in the messages of the checks they share
_RENAMES = {"repetition_penalty": "repeat_penalty", "max_tokens": "n_predict"}
# Samplers minivllm does not run: field -> its disabled value (any other is refused)
_UNSUPPORTED = {"typical_p": 1.0, "mirostat": 0, "dry_multiplier": 0.0,
                "xtc_probability": 0.0, "dynatemp_range": 0.0, "grammar": "",
                "post_sampling_probs": False}


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
            self.base.encode(text, name)  # refuses text that is not valid Unicode
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
        self.base.check_context(num_prompt_tokens, None, "prompt")
        sreq = SamplingRequest(
            temperature=max(req.temperature, 0.0), top_k=req.top_k if req.top_k > 0 else -1,
            top_p=req.top_p, min_p=req.min_p, repetition_penalty=req.repeat_penalty,
            presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
            stop=req.stop, seed=None if req.seed in (-1, DEFAULT_SEED) else req.seed,
            stream=req.stream, ignore_eos=req.ignore_eos,
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
        if req.stream:
            firsts = await first_outputs(gens)
            return SSEResponse(self._stream(req, gens, firsts, seats))
        finals = await gather_or_cancel(last_output(gen) for gen in gens)
        results = [self._final(req, i, out, out.outputs[0].token_ids, out.outputs[0].text,
                               out.outputs[0].logprobs or [], seats[i])
                   for i, out in enumerate(finals)]
        return JSONResponse(results[0] if len(results) == 1 else results)

    async def _stream(self, req: CompletionRequest, gens, firsts, seats
                      ) -> AsyncIterator[str]:
        counts = [0] * len(gens)
        try:
            async for i, out in merge_streams(gens, firsts):
                c = out.outputs[0]
                token_ids = [] if req.n_predict == 0 else c.token_ids
                counts[i] += len(token_ids)
                if c.text or token_ids:
                    chunk = {"index": i, "content": "" if req.n_predict == 0 else c.text,
                             "tokens": token_ids, "stop": False, "id_slot": seats[i],
                             "tokens_predicted": counts[i],
                             "tokens_evaluated": len(out.prompt_token_ids)}
                    if req.n_probs and c.logprobs:
                        chunk["completion_probabilities"] = self._probs(
                            req, token_ids, c.logprobs)
                    yield _sse(chunk)
                if out.finished:
                    yield _sse(self._final(req, i, out, [], "", [], seats[i], counts[i]))
        except Exception as e:  # whatever fails, the stream ends with an error event
            yield _sse(error_json(e)[0])

    # ---- answers ------------------------------------------------------------------------

    def _final(self, req: CompletionRequest, index: int, out: RequestOutput,
               token_ids: list[int], text: str, steps: list, seat: int,
               num_predicted: int | None = None) -> dict:
        """The last answer of a request (the whole of it unless streamed: then the text
        and tokens went before)."""
        c = out.outputs[0]
        if req.n_predict == 0:
            token_ids, text, steps, num_predicted = [], "", [], 0
        n_predicted = len(token_ids) if num_predicted is None else num_predicted
        n_prompt = len(out.prompt_token_ids)
        stop_word = c.stop_reason if isinstance(c.stop_reason, str) else ""
        stop_type = ("limit" if c.finish_reason == "length" else
                     "word" if stop_word else "eos" if c.finish_reason == "stop" else "none")
        result = {
            "index": index, "content": text,
            "tokens": token_ids if req.return_tokens else [],
            "id_slot": seat, "stop": True, "model": self.base.model_name,
            "tokens_predicted": n_predicted, "tokens_evaluated": n_prompt,
            "generation_settings": settings(req),
            "prompt": self.base.tokenizer.decode(out.prompt_token_ids),
            "has_new_line": "\n" in text, "truncated": (
                stop_type == "limit" and n_prompt + n_predicted >= self.base.max_model_len),
            "stop_type": stop_type, "stopping_word": stop_word,
            "tokens_cached": out.num_cached_tokens,
            "timings": _timings(out, n_predicted),
        }
        if req.n_probs and steps:
            result["completion_probabilities"] = self._probs(req, token_ids, steps)
        return result

    def _probs(self, req: CompletionRequest, token_ids: list[int],
               steps: list[dict[int, Logprob]]) -> list[dict]:
        tokenizer = self.base.tokenizer

        def entry(tid: int, lp: Logprob) -> dict:
            text = self.base.token_str(tid, lp)
            # the text's bytes, unless the token holds part of a character
            data = token_bytes(tokenizer, tid) if "\ufffd" in text else text.encode()
            return {"id": tid, "token": text, "bytes": list(data),
                    "logprob": max(lp.logprob, LOGPROB_FLOOR)}

        probs = []
        for tid, step in zip(token_ids, steps):
            top = sorted(step.items(), key=lambda item: -item[1].logprob)[:req.n_probs]
            probs.append({**entry(tid, step[tid]),
                          "top_logprobs": [entry(t, lp) for t, lp in top]})
        return probs


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _timings(out: RequestOutput, n_predicted: int) -> dict:
    """llama-server's timings: the prompt's part is from the first step scheduled to the
    first token, the prediction's from there to the last."""
    m = out.metrics
    prompt_ms = predicted_ms = 0.0
    if m is not None and m.first_token_time is not None:
        if m.first_scheduled_time is not None:
            prompt_ms = max(0.0, (m.first_token_time - m.first_scheduled_time) * 1e3)
        predicted_ms = max(0.0, ((m.last_token_time or m.first_token_time)
                                 - m.first_token_time) * 1e3)
    prompt_n = len(out.prompt_token_ids) - out.num_cached_tokens

    def rates(n: int, ms: float) -> tuple[float, float]:
        return (ms / n if n else 0.0), (n * 1e3 / ms if ms > 0 else 0.0)

    prompt_per_token, prompt_per_second = rates(prompt_n, prompt_ms)
    predicted_per_token, predicted_per_second = rates(n_predicted, predicted_ms)
    return {"cache_n": out.num_cached_tokens, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_per_token, "prompt_per_second": prompt_per_second,
            "predicted_n": n_predicted, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_per_token,
            "predicted_per_second": predicted_per_second}
