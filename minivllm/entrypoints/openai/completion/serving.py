"""POST /v1/completions: one engine request per prompt, answered whole or as a stream.

A request with several prompts and n > 1 has len(prompts) * n choices; the choice of
prompt i's j-th completion has index i * n + j (as in vLLM and OpenAI)."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict

from fastapi import Response
from fastapi.responses import JSONResponse

from minivllm.entrypoints.llamacpp.fim import FimTokens, infill_prompt
from minivllm.entrypoints.openai.completion.beam_search import (
    beam_search_choices,
    beam_search_params,
)
from minivllm.entrypoints.openai.completion.protocol import (
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
)
from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.protocol import UsageInfo
from minivllm.entrypoints.openai.request_timing import FirstTokenTiming, sse_with_timing
from minivllm.entrypoints.openai.serving import LOGPROB_FLOOR, OpenAIServing
from minivllm.entrypoints.openai.streaming import (
    SSE_DONE,
    SSEResponse,
    first_outputs,
    gather_or_cancel,
    last_output,
    merge_streams,
    sse,
    sse_error,
)
from minivllm.outputs import CompletionOutput, Logprob, RequestOutput


class OpenAIServingCompletion(OpenAIServing):
    # The model's FIM tokens and the tokens that end a middle, for `suffix` (set by
    # llamacpp/routes.py, which reads them once)
    fim: FimTokens = FimTokens()
    fim_stop_token_ids: tuple[int, ...] = ()

    async def create(self, req: CompletionRequest, received: float | None = None) -> Response:
        """`received`: when the HTTP request reached the server (the stream's `timing`)."""
        timing = FirstTokenTiming(received, self.ttft_sink)
        self.check_model(req.model)
        if req.stream and req.best_of is not None and req.best_of > req.n:
            raise OpenAIError(f"best_of: must equal n when streaming (the best are known only "
                              f"at the end), got best_of={req.best_of}, n={req.n}", 400,
                              "best_of")
        if req.suffix is not None:
            prompts = self._fim_prompt(req)
            req = req.model_copy(update={"stop_token_ids": [
                *(req.stop_token_ids or []), *self.fim_stop_token_ids]})
        else:
            prompts = self._tokenize_prompts(req.prompt)
        if req.use_beam_search:
            return await self._beam_search(req, prompts)
        # lm-eval's loglikelihood requests: echo=true, max_tokens=0 wants only the prompt's
        # logprobs. The engine needs one token to generate; it is dropped from the answer.
        echo_only = req.echo and req.max_tokens == 0
        max_tokens = 1 if echo_only else req.max_tokens
        prompt_logprobs = req.prompt_logprobs
        if prompt_logprobs is None and req.echo:
            prompt_logprobs = req.logprobs
        # One SamplingParams each: the engine fills in per-request fields.
        params = [self.sampling_params(req, max_tokens, req.logprobs, prompt_logprobs,
                                       best_of=req.best_of)
                  for _ in prompts]
        for _, token_ids in prompts:
            self.check_context(len(token_ids), max_tokens, "prompt")
        request_id = f"cmpl-{uuid.uuid4().hex}"
        gens = [self.generate(f"{request_id}-{i}", text, token_ids, params[i], req)
                for i, (text, token_ids) in enumerate(prompts)]
        if req.stream:
            firsts = await first_outputs(gens)
            return SSEResponse(self._stream(req, request_id, prompts, gens, firsts, echo_only,
                                            timing))
        finals = await gather_or_cancel(last_output(gen) for gen in gens)
        choices = []
        for i, final in enumerate(finals):
            for c in final.outputs:
                text, token_ids, steps = self._answer(req, prompts[i], final, c, echo_only,
                                                      first=True)
                choices.append(CompletionChoice(
                    index=i * req.n + c.index, text=text,
                    logprobs=self._logprobs(req, token_ids, steps, 0),
                    finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                    prompt_logprobs=self.prompt_logprobs(req, final.prompt_logprobs),
                    **self._token_ids(req, prompts[i], c, echo_only, first=True)))
        response = CompletionResponse(id=request_id, model=self.model_name, choices=choices,
                                      usage=self._usage(finals, echo_only))
        return JSONResponse(response.model_dump())

    async def _beam_search(self, req: CompletionRequest, prompts) -> Response:
        params = beam_search_params(self, req, prompts)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        choices, usage = await beam_search_choices(self, req, request_id, prompts, params)
        return JSONResponse(CompletionResponse(id=request_id, model=self.model_name,
                                               choices=choices, usage=usage).model_dump())

    def _fim_prompt(self, req: CompletionRequest) -> list[tuple[str | None, list[int]]]:
        """`suffix`: the prompt and suffix laid out as llama-server's /infill does."""
        if not isinstance(req.prompt, str):
            raise OpenAIError("suffix: needs the prompt as one text (the code before the "
                              "insertion point)", 400, "suffix")
        if req.echo:
            raise OpenAIError("echo: not supported with suffix", 400, "echo")
        try:
            self.fim.check("suffix")
        except ValueError as e:
            raise OpenAIError(str(e), 400, "suffix") from e
        self.encode(req.prompt, "prompt")  # refuse text that is not valid Unicode
        self.encode(req.suffix, "suffix")
        ids = infill_prompt(self.tokenizer, self.fim, req.prompt, req.suffix, [], "",
                            self.max_model_len, req.max_tokens or 0)
        return [(None, ids)]

    def _tokenize_prompts(self, prompt) -> list[tuple[str | None, list[int]]]:
        """The prompt field's four shapes as (text or None, token ids) pairs."""
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not prompt:
            raise OpenAIError("prompt must not be empty", 400, "prompt")
        self.check_limit("prompt", len(prompt), "max_prompts_per_request")
        prompts = []
        for p in prompt:
            token_ids = self.encode(p, "prompt") if isinstance(p, str) else list(p)
            self.check_token_ids(token_ids, "prompt")
            prompts.append((p if isinstance(p, str) else None, token_ids))
        return prompts

    def _answer(self, req: CompletionRequest, prompt: tuple[str | None, list[int]],
                output: RequestOutput, c: CompletionOutput, echo_only: bool, first: bool):
        """Choice c's text, token ids and logprob steps (all of them, or a stream's delta),
        with the prompt echoed in front of the first part when asked."""
        if echo_only:
            text, token_ids, steps = "", [], []
        else:
            text, token_ids, steps = c.text, c.token_ids, c.logprobs or []
        if req.echo and first:
            prompt_text, prompt_ids = prompt
            if prompt_text is None:
                prompt_text = self.tokenizer.decode(prompt_ids)
            text = prompt_text + text
            token_ids = prompt_ids + token_ids
            steps = list(output.prompt_logprobs or [None] * len(prompt_ids)) + steps
        return text, token_ids, steps

    @staticmethod
    def _token_ids(req: CompletionRequest, prompt: tuple[str | None, list[int]],
                   c: CompletionOutput, echo_only: bool, first: bool) -> dict:
        """return_token_ids: the generated ids (of this delta), the prompt's with the first.
        echo with max_tokens 0 drops the one token the engine had to generate: its id too."""
        if not req.return_token_ids:
            return {}
        ids = {"token_ids": [] if echo_only else list(c.token_ids)}
        if first:
            ids["prompt_token_ids"] = prompt[1]
        return ids

    def _logprobs(self, req: CompletionRequest, token_ids: list[int],
                  steps: list[dict[int, Logprob] | None], offset: int) -> CompletionLogProbs | None:
        """OpenAI's legacy logprobs: per token its string, logprob, top alternatives, offset."""
        if req.logprobs is None:
            return None
        result = CompletionLogProbs()
        for token_id, step in zip(token_ids, steps):
            if step is None:  # the first prompt token has nothing before it to predict it
                token = self.token_str(token_id)
                result.token_logprobs.append(None)
                result.top_logprobs.append(None)
            else:
                token = self.token_str(token_id, step.get(token_id))
                result.token_logprobs.append(max(step[token_id].logprob, LOGPROB_FLOOR))
                result.top_logprobs.append({
                    self.token_str(tid, lp): max(lp.logprob, LOGPROB_FLOOR)
                    for tid, lp in step.items()
                })
            result.tokens.append(token)
            result.text_offset.append(offset)
            offset += len(token)
        return result

    @staticmethod
    def _usage(finals: list[RequestOutput], echo_only: bool) -> UsageInfo:
        prompt = sum(len(f.prompt_token_ids) for f in finals)
        completion = 0 if echo_only else sum(len(c.token_ids) for f in finals
                                              for c in f.outputs)
        return UsageInfo.count(prompt, completion, sum(f.num_cached_tokens for f in finals))

    async def _stream(self, req, request_id, prompts, gens, firsts, echo_only, timing):
        created = int(time.time())
        offsets: dict[int, int] = defaultdict(int)  # per choice: logprob text offset
        started: set[int] = set()
        num_prompt_tokens = num_completion_tokens = num_cached_tokens = 0
        try:
            async for i, output in merge_streams(gens, firsts):
                for c in output.outputs:  # deltas: only what is new
                    index = i * req.n + c.index
                    num_completion_tokens += 0 if echo_only else len(c.token_ids)
                    first = index not in started
                    text, token_ids, steps = self._answer(
                        req, prompts[i], output, c, echo_only, first)
                    if not (text or token_ids or c.finish_reason):
                        continue
                    started.add(index)  # after the first chunk sent: it carries the prompt
                    choice = CompletionChoice(
                        index=index, text=text,
                        logprobs=self._logprobs(req, token_ids, steps, offsets[index]),
                        finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                        **self._token_ids(req, prompts[i], c, echo_only, first))
                    offsets[index] += len(text)
                    if c.token_ids and not echo_only:
                        timing.token_sent(output.metrics)
                    yield sse(CompletionResponse(id=request_id, created=created,
                                                 model=self.model_name, choices=[choice]))
                if output.finished:
                    num_prompt_tokens += len(output.prompt_token_ids)
                    num_cached_tokens += output.num_cached_tokens
            if req.stream_options and req.stream_options.include_usage:
                usage = UsageInfo.count(num_prompt_tokens, num_completion_tokens,
                                        num_cached_tokens)
                yield sse_with_timing(CompletionResponse(
                    id=request_id, created=created, model=self.model_name, choices=[],
                    usage=usage), timing)
        except Exception as e:  # whatever fails, the stream ends with an error event
            yield sse_error(e)
        yield SSE_DONE
