"""POST /v1/completions: one engine request per prompt, answered whole or as a stream."""

from __future__ import annotations

import time
import uuid

from fastapi import Response
from fastapi.responses import JSONResponse

from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
)
from minivllm.entrypoints.openai.serving import (
    ENGINE_ERRORS,
    LOGPROB_FLOOR,
    SSE_DONE,
    OpenAIServing,
    SSEResponse,
    first_outputs,
    gather_or_cancel,
    last_output,
    merge_streams,
    sendable_text_end,
    sse,
    sse_error,
)
from minivllm.outputs import Logprob, RequestOutput


class OpenAIServingCompletion(OpenAIServing):
    async def create(self, req: CompletionRequest) -> Response:
        self.check_model(req.model)
        if req.best_of not in (None, 1):
            raise OpenAIError(f"best_of: only 1 is supported, got {req.best_of}", 400, "best_of")
        prompts = self._tokenize_prompts(req.prompt)
        # lm-eval's loglikelihood requests: echo=true, max_tokens=0 wants only the prompt's
        # logprobs. The engine needs one token to generate; it is dropped from the answer.
        echo_only = req.echo and req.max_tokens == 0
        max_tokens = 1 if echo_only else req.max_tokens
        prompt_logprobs = req.logprobs if req.echo else None
        # One SamplingParams each: the engine fills in per-request fields.
        params = [self.sampling_params(req, max_tokens, req.logprobs, prompt_logprobs)
                  for _ in prompts]
        for _, token_ids in prompts:
            self.check_context(len(token_ids), max_tokens, "prompt")
        request_id = f"cmpl-{uuid.uuid4().hex}"
        gens = [self.generate(f"{request_id}-{i}", text, token_ids, params[i], req.priority)
                for i, (text, token_ids) in enumerate(prompts)]
        if req.stream:
            firsts = await first_outputs(gens)
            return SSEResponse(self._stream(req, request_id, prompts, params, gens, firsts,
                                            echo_only))
        finals = await gather_or_cancel(last_output(gen) for gen in gens)
        choices = []
        for i, final in enumerate(finals):
            text, token_ids, steps = self._answer(req, prompts[i], final, echo_only, first=True)
            choices.append(CompletionChoice(
                index=i, text=text, logprobs=self._logprobs(req, token_ids, steps, 0),
                finish_reason=final.outputs[0].finish_reason,
                stop_reason=final.outputs[0].stop_reason))
        response = CompletionResponse(id=request_id, model=self.model_name, choices=choices,
                                      usage=self._usage(finals, echo_only))
        return JSONResponse(response.model_dump())

    def _tokenize_prompts(self, prompt) -> list[tuple[str | None, list[int]]]:
        """The prompt field's four shapes as (text or None, token ids) pairs."""
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not prompt:
            raise OpenAIError("prompt must not be empty", 400, "prompt")
        prompts = []
        for p in prompt:
            token_ids = self.tokenizer.encode(p) if isinstance(p, str) else list(p)
            self.check_token_ids(token_ids, "prompt")
            prompts.append((p if isinstance(p, str) else None, token_ids))
        return prompts

    def _answer(self, req: CompletionRequest, prompt: tuple[str | None, list[int]],
                output: RequestOutput, echo_only: bool, first: bool,
                sent_text: int = 0, text_end: int | None = None, sent_tokens: int = 0):
        """Text, token ids and logprob steps not sent yet, with the prompt echoed in front
        of the first part when asked."""
        c = output.outputs[0]
        if echo_only:
            text, token_ids, steps = "", [], []
        else:
            text = c.text[sent_text:text_end]
            token_ids = c.token_ids[sent_tokens:]
            steps = (c.logprobs or [])[sent_tokens:]
        if req.echo and first:
            prompt_text, prompt_ids = prompt
            if prompt_text is None:
                prompt_text = self.tokenizer.decode(prompt_ids)
            text = prompt_text + text
            token_ids = prompt_ids + token_ids
            steps = list(output.prompt_logprobs or [None] * len(prompt_ids)) + steps
        return text, token_ids, steps

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
        completion = 0 if echo_only else sum(len(f.outputs[0].token_ids) for f in finals)
        return UsageInfo(prompt_tokens=prompt, completion_tokens=completion,
                         total_tokens=prompt + completion)

    async def _stream(self, req, request_id, prompts, params, gens, firsts, echo_only):
        created = int(time.time())
        n = len(gens)
        sent_text, sent_tokens, offsets = [0] * n, [0] * n, [0] * n
        started = [False] * n
        finals: list[RequestOutput] = []
        try:
            async for i, output in merge_streams(gens, firsts):
                c = output.outputs[0]
                text_end = sendable_text_end(output, params[i], sent_text[i])
                text, token_ids, steps = self._answer(req, prompts[i], output, echo_only,
                                                      not started[i], sent_text[i], text_end,
                                                      sent_tokens[i])
                started[i] = True
                sent_text[i], sent_tokens[i] = text_end, len(c.token_ids)
                finish_reason = c.finish_reason if output.finished else None
                if not (text or token_ids or finish_reason):
                    continue
                choice = CompletionChoice(
                    index=i, text=text, logprobs=self._logprobs(req, token_ids, steps, offsets[i]),
                    finish_reason=finish_reason, stop_reason=c.stop_reason if finish_reason else None)
                offsets[i] += len(text)
                yield sse(CompletionResponse(id=request_id, created=created, model=self.model_name,
                                             choices=[choice]))
                if output.finished:
                    finals.append(output)
            if req.stream_options and req.stream_options.include_usage:
                yield sse(CompletionResponse(id=request_id, created=created, model=self.model_name,
                                             choices=[], usage=self._usage(finals, echo_only)))
        except (*ENGINE_ERRORS, OpenAIError) as e:
            yield sse_error(e)
        yield SSE_DONE
