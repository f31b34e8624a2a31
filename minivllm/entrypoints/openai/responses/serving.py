"""POST /v1/responses (OpenAI's Responses API, as vLLM serves it), GET and DELETE
/v1/responses/{id}: a response is one chat completion (input.py builds it) whose
choice becomes output items — reasoning (with --reasoning-parser), a message, function calls
(tool_choice "required" or named: a grammar forces them; "auto": --tool-call-parser reads
them) — answered whole or as typed events (stream.py), and kept for
previous_response_id (store.py) unless `store` is false or the store is off."""

from __future__ import annotations

import uuid

from fastapi import Response
from fastapi.responses import JSONResponse

from minivllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from minivllm.entrypoints.openai.errors import OpenAIError, log_if_unexpected, to_openai_error
from minivllm.entrypoints.openai.protocol import ChatMessage
from minivllm.entrypoints.openai.responses.input import (
    chat_request,
    input_messages,
    output_messages,
    renamed,
)
from minivllm.entrypoints.openai.responses.protocol import (
    IncompleteDetails,
    InputTokensDetails,
    OutputTokensDetails,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from minivllm.entrypoints.openai.responses.store import ResponseStore, StoredResponse
from minivllm.entrypoints.openai.responses.stream import ResponseEvents, items
from minivllm.entrypoints.openai.streaming import (
    SSEResponse,
    first_outputs,
    last_output,
    merge_streams,
)
from minivllm.outputs import RequestOutput


class OpenAIServingResponses:
    def __init__(self, chat: OpenAIServingChat, store: ResponseStore) -> None:
        self.chat, self.store = chat, store

    # ---- GET / DELETE -------------------------------------------------------------------

    def _stored(self, response_id: str) -> StoredResponse:
        stored = self.store.get(response_id)
        if stored is None:
            raise OpenAIError(f"Response with id '{response_id}' not found.", 404,
                              "response_id")
        return stored

    def retrieve(self, response_id: str) -> dict:
        return self._stored(response_id).response.model_dump(mode="json")

    def delete(self, response_id: str) -> dict:
        self._stored(response_id)
        self.store.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    # ---- POST ---------------------------------------------------------------------------

    def _history(self, req: ResponsesRequest) -> list[ChatMessage]:
        if req.previous_response_id is None:
            return []
        if not self.store.enabled:
            raise OpenAIError("previous_response_id: this server keeps no responses "
                              "(--responses-store-size 0)", 400, "previous_response_id")
        stored = self.store.get(req.previous_response_id)
        if stored is None:
            raise OpenAIError(f"previous_response_id: no response with id "
                              f"'{req.previous_response_id}' (never stored, deleted or "
                              "evicted)", 400, "previous_response_id")
        return list(stored.messages)

    def _response(self, req: ResponsesRequest) -> ResponseObject:
        tool_choice = req.tool_choice or "auto"
        return ResponseObject(
            model=self.chat.model_name, instructions=req.instructions,
            max_output_tokens=req.max_output_tokens, temperature=req.temperature,
            top_p=req.top_p, parallel_tool_calls=req.parallel_tool_calls,
            previous_response_id=req.previous_response_id,
            store=req.store and self.store.enabled, user=req.user,
            metadata=req.metadata or {},
            text=req.text.model_dump(mode="json", by_alias=True, exclude_none=True)
            if req.text and req.text.format else {"format": {"type": "text"}},
            tool_choice=tool_choice if isinstance(tool_choice, str)
            else tool_choice.model_dump(),
            tools=[t.model_dump(exclude_none=True) for t in req.tools or []])

    async def create(self, req: ResponsesRequest) -> Response:
        conversation = self._history(req) + input_messages(req)
        system = [ChatMessage(role="system", content=req.instructions)] \
            if req.instructions else []
        try:
            chat_req = chat_request(req, system + conversation)
            prompt, token_ids, params = self.chat.prepare(chat_req)
        except OpenAIError as e:
            raise renamed(e) from e
        response = self._response(req)
        gen = self.chat.generate(f"resp-{uuid.uuid4().hex}", prompt, token_ids, params,
                                 chat_req)
        if req.stream:
            first = (await first_outputs([gen]))[0]
            return SSEResponse(self._stream(chat_req, response, conversation, gen, first))
        final = await last_output(gen)
        choice = final.outputs[0]
        content, reasoning, calls = self.chat.choice_parser(chat_req).whole(choice.text)
        incomplete = choice.finish_reason == "length"
        response.output = items(content, reasoning, calls, incomplete)
        self._finish(response, len(final.prompt_token_ids), len(choice.token_ids),
                     final.num_cached_tokens, reasoning or "", incomplete)
        self._keep(response, conversation)
        return JSONResponse(response.model_dump(mode="json"))

    def _finish(self, response: ResponseObject, prompt: int, output: int, cached: int,
                reasoning: str, incomplete: bool) -> None:
        """The response's status and usage (`prompt`, `output`, `cached`: token counts)."""
        response.status = "incomplete" if incomplete else "completed"
        if incomplete:
            response.incomplete_details = IncompleteDetails(reason="max_output_tokens")
        # The thinking's share of the output tokens, as the tokenizer writes that text
        thinking = len(self.chat.tokenizer.encode(reasoning, add_special_tokens=False)) \
            if reasoning else 0
        response.usage = ResponseUsage(
            input_tokens=prompt, output_tokens=output, total_tokens=prompt + output,
            input_tokens_details=InputTokensDetails(cached_tokens=cached),
            output_tokens_details=OutputTokensDetails(reasoning_tokens=min(thinking, output)))

    def _keep(self, response: ResponseObject, conversation: list[ChatMessage]) -> None:
        """Store the response (with the conversation it continues) when it is to be."""
        if response.store:
            self.store.put(StoredResponse(
                response, conversation + output_messages(response.output)))

    async def _stream(self, chat_req, response: ResponseObject,
                      conversation: list[ChatMessage], gen, first: RequestOutput):
        events = ResponseEvents(response)
        parser = self.chat.choice_parser(chat_req)
        num_output, reasoning, finish_reason = 0, "", None
        try:
            for event in events.start():
                yield event
            async for _, output in merge_streams([gen], [first]):
                c = output.outputs[0]  # a delta: only what is new
                num_output += len(c.token_ids)
                finish_reason = c.finish_reason
                content, thinking, calls = parser.feed(c.text, c.finish_reason is not None)
                reasoning += thinking
                for event in events.feed(content, thinking, calls):
                    yield event
            incomplete = finish_reason == "length"
            self._finish(response, len(first.prompt_token_ids), num_output,
                         output.num_cached_tokens, reasoning, incomplete)
            for event in events.finish(incomplete):
                yield event
            self._keep(response, conversation)
        except Exception as e:  # whatever fails, the stream ends with an error event
            log_if_unexpected(e)
            err = to_openai_error(e)
            yield events.error(err.message, err.status, err.param)
