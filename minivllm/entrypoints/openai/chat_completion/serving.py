"""POST /v1/chat/completions: messages through the chat template, answered whole or streamed;
tools rendered by the template, tool calls forced by a grammar or parsed from the text, and
the thinking of reasoning models split off (choice_parser.py)."""

from __future__ import annotations

import dataclasses
import time
import uuid

from fastapi import Response
from fastapi.responses import JSONResponse

from minivllm.entrypoints.openai.chat_completion.choice_parser import ChoiceParser
from minivllm.entrypoints.openai.chat_completion.protocol import (
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
)
from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.protocol import UsageInfo
from minivllm.entrypoints.openai.request_timing import FirstTokenTiming, sse_with_timing
from minivllm.entrypoints.openai.serving import LOGPROB_FLOOR, OpenAIServing
from minivllm.entrypoints.openai.streaming import (
    SSE_DONE,
    SSEResponse,
    first_outputs,
    last_output,
    merge_streams,
    sse,
    sse_error,
)
from minivllm.entrypoints.openai.structured import tool_choice_constraint
from minivllm.outputs import Logprob, RequestOutput
from minivllm.sampling_params import SamplingParams


class OpenAIServingChat(OpenAIServing):
    tool_parser = None  # --enable-auto-tool-choice --tool-call-parser (tool_parsers.py)
    reasoning_parser = None  # --reasoning-parser (reasoning_parsers.py)

    def _tool_mode(self, req: ChatCompletionRequest) -> str:
        choice = req.tool_choice
        if not req.tools or choice == "none":
            return "none"
        if choice == "required":
            return "required"
        if choice is not None and choice != "auto":
            return "named"
        if self.tool_parser is None:  # the default "auto" without a parser: text only
            if choice == "auto":
                raise OpenAIError('tool_choice: "auto" needs a server started with '
                                  "--enable-auto-tool-choice --tool-call-parser NAME", 400,
                                  "tool_choice")
            return "none"
        return "auto"

    def choice_parser(self, req: ChatCompletionRequest) -> ChoiceParser:
        mode = self._tool_mode(req)
        named = req.tool_choice.function.name if mode == "named" else None
        return ChoiceParser(mode, named, self.tool_parser, self.reasoning_parser)

    async def create(self, req: ChatCompletionRequest, received: float | None = None) -> Response:
        """`received`: when the HTTP request reached the server (the stream's `timing`)."""
        timing = FirstTokenTiming(received, self.ttft_sink)
        prompt, token_ids, params = self.prepare(req)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        gen = self.generate(request_id, prompt, token_ids, params, req)
        if req.stream:
            firsts = await first_outputs([gen])
            return SSEResponse(self._stream(req, request_id, gen, firsts[0], timing))
        final = await last_output(gen)
        choices = []
        for c in final.outputs:
            content, reasoning, tool_calls = self.choice_parser(req).whole(c.text)
            finish = "tool_calls" if tool_calls and c.finish_reason == "stop" else c.finish_reason
            choices.append(ChatChoice(
                index=c.index, message=ChatResponseMessage(
                    content=content, reasoning_content=reasoning, tool_calls=tool_calls),
                logprobs=self._logprobs(req, c.token_ids, c.logprobs), finish_reason=finish,
                stop_reason=c.stop_reason,
                token_ids=list(c.token_ids) if req.return_token_ids else None))
        response = ChatCompletionResponse(
            id=request_id, model=self.model_name, choices=choices, usage=self._usage(final),
            prompt_logprobs=self.prompt_logprobs(req, final.prompt_logprobs),
            prompt_token_ids=token_ids if req.return_token_ids else None)
        return JSONResponse(response.model_dump())

    def prepare(self, req: ChatCompletionRequest) -> tuple[str, list[int], SamplingParams]:
        """The request checked and turned into the engine's input: (prompt, its token ids,
        sampling params), tool calls forced by a grammar where tool_choice asks."""
        self.check_model(req.model)
        if req.top_logprobs is not None and not req.logprobs:
            raise OpenAIError("top_logprobs: requires logprobs to be true", 400, "top_logprobs")
        if req.top_logprobs is not None and req.top_logprobs < 0:
            raise OpenAIError("top_logprobs must be >= 0", 400, "top_logprobs")
        max_tokens = req.max_tokens if req.max_completion_tokens is None \
            else req.max_completion_tokens
        params = self.sampling_params(req, max_tokens,
                                      (req.top_logprobs or 0) if req.logprobs else None,
                                      req.prompt_logprobs, logprobs_param="top_logprobs")
        self.choice_parser(req)  # a tool_choice this server cannot serve: 400 now
        forced = tool_choice_constraint(req)
        if forced is not None:
            if params.structured_outputs is not None:
                raise OpenAIError("tool_choice: a forced tool call cannot be combined with "
                                  "response_format or structured_outputs", 400, "tool_choice")
            params = dataclasses.replace(params, structured_outputs=forced)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        prompt = self.render_chat(req.messages, req.add_generation_prompt, tools)
        # The template writes the special tokens (BOS ...) itself.
        token_ids = self.encode(prompt, "messages", add_special_tokens=False)
        self.check_token_ids(token_ids, "messages")
        self.check_context(len(token_ids), max_tokens, "messages")
        return prompt, token_ids, params

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
        prompt = len(final.prompt_token_ids)
        completion = sum(len(c.token_ids) for c in final.outputs)
        return UsageInfo.count(prompt, completion, final.num_cached_tokens)

    async def _stream(self, req, request_id, gen, first, timing):
        created = int(time.time())

        def chunk(index: int, delta: DeltaMessage, logprobs=None, finish_reason=None,
                  stop_reason=None, token_ids=None, prompt_token_ids=None):
            choice = ChatStreamChoice(index=index, delta=delta, logprobs=logprobs,
                                      finish_reason=finish_reason, stop_reason=stop_reason,
                                      token_ids=token_ids if req.return_token_ids else None)
            return sse(ChatCompletionChunk(id=request_id, created=created, model=self.model_name,
                                           choices=[choice], prompt_token_ids=prompt_token_ids))

        try:
            parsers = [self.choice_parser(req) for _ in range(req.n)]
            for index in range(req.n):
                # return_token_ids: the first chunk carries the prompt's ids
                prompt_ids = first.prompt_token_ids if req.return_token_ids and index == 0 \
                    else None
                yield chunk(index, DeltaMessage(role="assistant", content=""), token_ids=[],
                            prompt_token_ids=prompt_ids)
            num_completion_tokens = 0
            async for _, output in merge_streams([gen], [first]):
                for c in output.outputs:  # deltas: only what is new
                    num_completion_tokens += len(c.token_ids)
                    if c.text or c.token_ids or c.finish_reason:
                        parser = parsers[c.index]
                        content, reasoning, calls = parser.feed(
                            c.text, c.finish_reason is not None)
                        finish = c.finish_reason
                        if parser.called and finish == "stop":
                            finish = "tool_calls"
                        delta = DeltaMessage(content=content if content or not (
                            reasoning or calls) else None, reasoning_content=reasoning or None,
                            tool_calls=calls or None)
                        if c.token_ids:
                            timing.token_sent(output.metrics)
                        yield chunk(c.index, delta,
                                    self._logprobs(req, c.token_ids, c.logprobs),
                                    finish, c.stop_reason, list(c.token_ids))
                if output.finished and req.stream_options and req.stream_options.include_usage:
                    prompt = len(output.prompt_token_ids)
                    usage = UsageInfo.count(prompt, num_completion_tokens,
                                            output.num_cached_tokens)
                    yield sse_with_timing(ChatCompletionChunk(
                        id=request_id, created=created, model=self.model_name, choices=[],
                        usage=usage), timing)
        except Exception as e:  # whatever fails, the stream ends with an error event
            yield sse_error(e)
        yield SSE_DONE
