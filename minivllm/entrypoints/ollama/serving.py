"""POST /api/chat and /api/generate: each request mapped onto the OpenAI serving objects
(chat's prepare, its tool and reasoning parsers, completion's sampling checks; one engine
call, theirs), answered as one JSON object or as Ollama's NDJSON stream: a line per new
piece of text, then a last line with done, done_reason and the counts and durations."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from datetime import datetime, timezone

from fastapi import Response
from fastapi.responses import JSONResponse

from minivllm.entrypoints.ollama import go_template
from minivllm.entrypoints.ollama.errors import error_line
from minivllm.entrypoints.ollama.mapping import (
    build,
    chat_messages,
    response_format,
    sampling_fields,
)
from minivllm.entrypoints.ollama.protocol import ChatRequest, GenerateRequest
from minivllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from minivllm.entrypoints.openai.completion.protocol import CompletionRequest
from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.protocol import ChatMessage
from minivllm.entrypoints.openai.streaming import SSEResponse, first_outputs, last_output
from minivllm.outputs import RequestOutput

NS = 1_000_000_000


class NDJSONResponse(SSEResponse):
    """Ollama's stream: one JSON object a line (closed, and so aborted, however it ends)."""

    media_type = "application/x-ndjson"


def now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def line(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


@dataclasses.dataclass
class Run:
    """One request on its way: what the answer needs besides the engine's outputs."""

    model: str  # the name the request used (Ollama echoes it)
    received: float
    parser: object | None = None  # chat's ChoiceParser
    keep_context: bool = False  # generate: answer with `context`
    prompt_ids: list[int] = dataclasses.field(default_factory=list)
    output_ids: list[int] = dataclasses.field(default_factory=list)


def stats(run: Run, output: RequestOutput, done_reason: str | None) -> dict:
    """The last object's fields: done, why, the counts and the durations in nanoseconds."""
    m = output.metrics
    first, scheduled, last = ((m.first_token_time, m.first_scheduled_time, m.last_token_time)
                              if m else (None, None, None))
    fields = {
        "done": True, "done_reason": done_reason or "stop",
        "total_duration": int((time.time() - run.received) * NS),
        "load_duration": 0,  # loaded when the server started
        "prompt_eval_count": len(output.prompt_token_ids),
        "prompt_eval_duration": int((first - scheduled) * NS) if first and scheduled else 0,
        "eval_count": len(run.output_ids),
        "eval_duration": int((last - first) * NS) if last and first else 0}
    if run.keep_context:
        fields["context"] = run.prompt_ids + run.output_ids
    return fields


def ollama_tool_calls(calls) -> list[dict]:
    """OpenAI tool calls (arguments as JSON text) as Ollama's (arguments as an object)."""
    return [{"function": {"name": c.function.name,
                          "arguments": json.loads(c.function.arguments or "{}")}}
            for c in calls]


class OllamaServingGeneration:
    def __init__(self, completions, chat) -> None:
        self.completions, self.chat = completions, chat

    def _check_runner(self) -> None:
        """The engine refuses generation on a pooling runner; said first here, before a
        prompt is rendered with a chat template such a server may not have."""
        config = self.chat.engine.config.model_config
        if config.runner_type == "pooling":
            raise OpenAIError(f"this server runs --runner {config.runner}: it serves "
                              "embeddings (/api/embed) only, not generation", 400)

    # ---- POST /api/chat -----------------------------------------------------------------

    async def chat_(self, req: ChatRequest, served: str, received: float) -> Response:
        run = Run(req.model, received)
        self._check_runner()
        if not req.messages:  # Ollama's "load the model": it is loaded
            return JSONResponse({"model": req.model, "created_at": now(), "done": True,
                                 "done_reason": "load",
                                 "message": {"role": "assistant", "content": ""}})
        if req.tools and self.chat.tool_parser is None:
            raise OpenAIError("tools: this server parses no tool calls: start it with "
                              "--enable-auto-tool-choice --tool-call-parser NAME (hermes for "
                              "Qwen2.5 and Qwen3, llama3_json for Llama 3)", 400)
        oai = build(ChatCompletionRequest, model=served, stream=req.stream,
                    messages=chat_messages(req.messages),
                    tools=[t.model_dump(exclude_none=True) for t in req.tools or []] or None,
                    tool_choice="auto" if req.tools else None,
                    response_format=response_format(req.format),
                    **sampling_fields(req.options, self.chat.max_model_len))
        prompt, token_ids, params = self.chat.prepare(oai)
        params = self._num_ctx(req, params, len(token_ids))
        run.parser = self.chat.choice_parser(oai)
        gen = self.chat.generate(f"ollama-chat-{uuid.uuid4().hex}", prompt, token_ids, params,
                                 oai)
        return await self._answer(run, gen, req.stream, self._chat_body)

    @staticmethod
    def _chat_body(run: Run, text: str, final: bool, whole: bool) -> dict | None:
        if whole:
            content, thinking, calls = run.parser.whole(text)
        else:
            content, thinking, calls = run.parser.feed(text, final)
            if not (content or thinking or calls or final):
                return None
        message = {"role": "assistant", "content": content or ""}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = ollama_tool_calls(calls)
        return {"message": message}

    # ---- POST /api/generate -------------------------------------------------------------

    async def generate(self, req: GenerateRequest, served: str, received: float) -> Response:
        run = Run(req.model, received, keep_context=not req.raw)
        self._check_runner()
        if req.images:
            raise OpenAIError("images: this server runs text models only", 400)
        if not req.prompt and not req.context:
            return JSONResponse({"model": req.model, "created_at": now(), "response": "",
                                 "done": True, "done_reason": "load"})
        serving = self.completions
        fields = sampling_fields(req.options, serving.max_model_len)
        oai = build(CompletionRequest, model=served, stream=req.stream, prompt=req.prompt,
                    response_format=response_format(req.format), **fields)
        if req.suffix and req.context:
            raise OpenAIError("context: not with suffix (a fill-in-the-middle prompt is laid "
                              "out whole)", 400)
        if req.suffix:  # fill in the middle: the model's FIM tokens end it
            oai = oai.model_copy(update={"suffix": req.suffix,
                                         "stop_token_ids": list(serving.fim_stop_token_ids)})
        params = serving.sampling_params(oai, fields["max_tokens"], None)
        prompt, token_ids = self._generate_prompt(req, oai)
        if req.context:
            serving.check_token_ids(req.context, "context")
            token_ids = list(req.context) + token_ids
        serving.check_token_ids(token_ids, "prompt")
        serving.check_context(len(token_ids), fields["max_tokens"], "prompt")
        params = self._num_ctx(req, params, len(token_ids))
        run.prompt_ids = token_ids
        gen = serving.generate(f"ollama-gen-{uuid.uuid4().hex}", prompt, token_ids, params, oai)
        return await self._answer(run, gen, req.stream, self._generate_body)

    def _generate_prompt(self, req: GenerateRequest, oai: CompletionRequest
                         ) -> tuple[str | None, list[int]]:
        """suffix: the prompt and the suffix laid out with the model's FIM tokens (as
        /v1/completions' suffix); raw: the prompt as it is; template: Ollama's Go template
        of it; else the model's chat template over the system message and the prompt."""
        serving = self.completions
        if req.suffix:
            ((_, token_ids),) = serving._fim_prompt(oai)  # completion/serving.py's layout
            return None, token_ids
        if req.raw:
            return req.prompt, serving.encode(req.prompt, "prompt")
        if req.template is not None:
            try:
                text = go_template.render(req.template, {"System": req.system or "",
                                                         "Prompt": req.prompt})
            except ValueError as e:
                raise OpenAIError(str(e), 400, "template") from e
            return text, serving.encode(text, "template")
        messages = [ChatMessage(role="user", content=req.prompt)]
        if req.system:
            messages.insert(0, ChatMessage(role="system", content=req.system))
        text = self.chat.render_chat(messages, add_generation_prompt=True)
        return text, serving.encode(text, "prompt", add_special_tokens=False)

    @staticmethod
    def _generate_body(run: Run, text: str, final: bool, whole: bool) -> dict | None:
        if not (text or final or whole):
            return None
        return {"response": text}

    # ---- shared -------------------------------------------------------------------------

    @staticmethod
    def _num_ctx(req, params, num_prompt_tokens: int):
        """num_ctx below the engine's length bounds this request's context: without
        num_predict, the answer ends where num_ctx does."""
        num_ctx = req.options.num_ctx
        if num_ctx is None:
            return params
        if num_prompt_tokens >= num_ctx:
            raise OpenAIError(f"options.num_ctx: the prompt ({num_prompt_tokens} tokens) "
                              f"does not fit a context of {num_ctx} tokens", 400)
        if params.max_tokens is None:
            return dataclasses.replace(params, max_tokens=num_ctx - num_prompt_tokens)
        return params

    async def _answer(self, run: Run, gen, stream: bool, body) -> Response:
        head = {"model": run.model}
        if not stream:
            final = await last_output(gen)
            c = final.outputs[0]
            run.output_ids = list(c.token_ids)
            return JSONResponse({**head, "created_at": now(), **body(run, c.text, True, True),
                                 **stats(run, final, c.finish_reason)})
        first = (await first_outputs([gen]))[0]  # a rejection is still a 4xx here

        async def lines():
            output = first
            try:
                while True:
                    c = output.outputs[0]
                    run.output_ids += c.token_ids
                    final = c.finish_reason is not None
                    piece = body(run, c.text, final, False)
                    if piece is not None and not final:
                        yield line({**head, "created_at": now(), **piece, "done": False})
                    if final:  # with what a parser held back to the end
                        yield line({**head, "created_at": now(), **piece,
                                    **stats(run, output, c.finish_reason)})
                        return
                    output = await anext(gen)
            except Exception as e:  # whatever fails, the stream ends with an error object
                yield error_line(e)
            finally:
                await gen.aclose()

        return NDJSONResponse(lines())
