"""POST /v1/chat/completions: messages through the chat template, answered whole or streamed."""

from __future__ import annotations

import time
import uuid

from fastapi import Response
from fastapi.responses import JSONResponse

from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatLogprobToken,
    ChatResponseMessage,
    ChatStreamChoice,
    DeltaMessage,
    TopLogprob,
    UsageInfo,
)
from minivllm.entrypoints.openai.serving import (
    ENGINE_ERRORS,
    LOGPROB_FLOOR,
    SSE_DONE,
    OpenAIServing,
    SSEResponse,
    first_outputs,
    last_output,
    merge_streams,
    sendable_text_end,
    sse,
    sse_error,
)
from minivllm.outputs import Logprob, RequestOutput


class OpenAIServingChat(OpenAIServing):
    async def create(self, req: ChatCompletionRequest) -> Response:
        self.check_model(req.model)
        if req.top_logprobs is not None and not req.logprobs:
            raise OpenAIError("top_logprobs: requires logprobs to be true", 400, "top_logprobs")
        if req.top_logprobs is not None and req.top_logprobs < 0:
            raise OpenAIError("top_logprobs must be >= 0", 400, "top_logprobs")
        max_tokens = req.max_tokens if req.max_completion_tokens is None \
            else req.max_completion_tokens
        params = self.sampling_params(req, max_tokens,
                                      (req.top_logprobs or 0) if req.logprobs else None)
        prompt = self.render_chat(req.messages, req.add_generation_prompt)
        # The template writes the special tokens (BOS ...) itself.
        token_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        self.check_token_ids(token_ids, "messages")
        self.check_context(len(token_ids), max_tokens, "messages")
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        gen = self.generate(request_id, prompt, token_ids, params, req.priority)
        if req.stream:
            firsts = await first_outputs([gen])
            return SSEResponse(self._stream(req, request_id, params, gen, firsts[0]))
        final = await last_output(gen)
        c = final.outputs[0]
        choice = ChatChoice(index=0, message=ChatResponseMessage(content=c.text),
                            logprobs=self._logprobs(req, c.token_ids, c.logprobs),
                            finish_reason=c.finish_reason, stop_reason=c.stop_reason)
        response = ChatCompletionResponse(id=request_id, model=self.model_name, choices=[choice],
                                          usage=self._usage(final))
        return JSONResponse(response.model_dump())

    def _logprobs(self, req: ChatCompletionRequest, token_ids: list[int],
                  steps: list[dict[int, Logprob]] | None) -> ChatLogprobs | None:
        if not req.logprobs:
            return None
        content = []
        for token_id, step in zip(token_ids, steps or []):
            token = self.token_str(token_id, step[token_id])
            best = sorted(step.items(), key=lambda kv: kv[1].rank or 0)[:req.top_logprobs or 0]
            top = [self._top(tid, lp) for tid, lp in best]
            content.append(ChatLogprobToken(
                token=token, logprob=max(step[token_id].logprob, LOGPROB_FLOOR),
                bytes=list(token.encode()), top_logprobs=top))
        return ChatLogprobs(content=content)

    def _top(self, token_id: int, logprob: Logprob) -> TopLogprob:
        token = self.token_str(token_id, logprob)
        return TopLogprob(token=token, logprob=max(logprob.logprob, LOGPROB_FLOOR),
                          bytes=list(token.encode()))

    @staticmethod
    def _usage(final: RequestOutput) -> UsageInfo:
        prompt, completion = len(final.prompt_token_ids), len(final.outputs[0].token_ids)
        return UsageInfo(prompt_tokens=prompt, completion_tokens=completion,
                         total_tokens=prompt + completion)

    async def _stream(self, req, request_id, params, gen, first):
        created = int(time.time())

        def chunk(delta: DeltaMessage, logprobs=None, finish_reason=None, stop_reason=None):
            choice = ChatStreamChoice(index=0, delta=delta, logprobs=logprobs,
                                      finish_reason=finish_reason, stop_reason=stop_reason)
            return sse(ChatCompletionChunk(id=request_id, created=created, model=self.model_name,
                                           choices=[choice]))

        try:
            yield chunk(DeltaMessage(role="assistant", content=""))
            sent_text = sent_tokens = 0
            async for _, output in merge_streams([gen], [first]):
                c = output.outputs[0]
                text_end = sendable_text_end(output, params, sent_text)
                text, token_ids = c.text[sent_text:text_end], c.token_ids[sent_tokens:]
                steps = (c.logprobs or [])[sent_tokens:]
                sent_text, sent_tokens = text_end, len(c.token_ids)
                finish_reason = c.finish_reason if output.finished else None
                if text or token_ids or finish_reason:
                    yield chunk(DeltaMessage(content=text),
                                self._logprobs(req, token_ids, steps), finish_reason,
                                c.stop_reason if finish_reason else None)
                if output.finished and req.stream_options and req.stream_options.include_usage:
                    yield sse(ChatCompletionChunk(id=request_id, created=created,
                                                  model=self.model_name, choices=[],
                                                  usage=self._usage(output)))
        except (*ENGINE_ERRORS, OpenAIError) as e:
            yield sse_error(e)
        yield SSE_DONE
