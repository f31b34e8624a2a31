"""OpenAIServing, what the endpoints share: request checks, sampling params, prompts (text,
chat template, logprobs) and the engine call. The stream plumbing is in streaming.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import jinja2

from minivllm.core.request import check_context_length
from minivllm.engine.generation_defaults import load_sampling_defaults
from minivllm.engine.messages import make_core_request
from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.limits import RequestLimits
from minivllm.entrypoints.openai.protocol import (
    ChatMessage,
    PromptLogprob,
    PromptLogprobs,
    SamplingRequest,
)
from minivllm.entrypoints.openai.structured import request_constraint
from minivllm.outputs import Logprob, RequestOutput
from minivllm.sampling_params import RequestOutputKind, SamplingParams

if TYPE_CHECKING:
    from minivllm.engine.async_llm import AsyncLLM
    from minivllm.entrypoints.openai.models.serving import OpenAIServingModels
    from minivllm.lora.request import LoRARequest

LOGPROB_FLOOR = -9999.0  # JSON has no -inf


class OpenAIServing:
    def __init__(self, engine: AsyncLLM, model_name: str,
                 chat_template: str | None = None, limits: RequestLimits = RequestLimits(),
                 default_sampling: dict | None = None) -> None:
        self.engine = engine
        # The model's generation config defaults (engine/generation_defaults.py), for the
        # fields a request leaves unset; None: read them from the engine's config.
        if default_sampling is None:
            default_sampling = load_sampling_defaults(engine.config)[0]
        self.default_sampling = default_sampling
        self.model_name = model_name
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.chat_template = chat_template
        self.limits = limits
        # The base model and its LoRA adapters (models/serving.py); None: the base alone
        self.models: OpenAIServingModels | None = None
        # Where each stream's TTFT parts go once its first token is sent (the dashboard)
        self.ttft_sink: Callable[[dict], None] | None = None

    # ---- checks -------------------------------------------------------------------------

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter the request's model field names (None: the base model); 404 for
        a name this server does not serve."""
        if model is None or model == self.model_name:
            return None
        lora = self.models.lora_requests.get(model) if self.models is not None else None
        if lora is None:
            raise OpenAIError(f"The model `{model}` does not exist.", 404, "model")
        return lora

    def check_token_ids(self, token_ids: list[int], param: str, allow_empty: bool = False
                        ) -> None:
        if not token_ids and not allow_empty:
            raise OpenAIError(f"{param} must not be empty", 400, param)
        vocab_size = len(self.tokenizer)
        bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise OpenAIError(f"{param}: token id {bad} is outside the vocabulary "
                              f"[0, {vocab_size})", 400, param)

    def check_context(self, num_prompt_tokens: int, max_tokens: int | None, where: str) -> None:
        """The HTTP edge's one context-length check: a 400 naming the field (`where`)."""
        # The engine core checks again, deliberately: it also takes requests no edge checked.
        try:
            check_context_length(num_prompt_tokens, max_tokens, self.max_model_len, where)
        except ValueError as e:
            raise OpenAIError(str(e), 400, where) from e

    def check_limit(self, param: str, value: int, limit: str) -> None:
        """400 when `value` is over RequestLimits.<limit>, naming its flag."""
        bound = getattr(self.limits, limit)
        if value > bound:
            flag = "--" + limit.replace("_", "-")
            raise OpenAIError(f"{param} must be <= {bound} ({flag}), got {value}", 400, param)

    def sampling_params(self, req: SamplingRequest, max_tokens: int | None,
                        logprobs: int | None, prompt_logprobs: int | None = None,
                        best_of: int | None = None, logprobs_param: str = "logprobs"
                        ) -> SamplingParams:
        """The request's SamplingParams, after the server's caps; `logprobs_param` is the
        field that asked for logprobs (chat calls it top_logprobs)."""
        if req.stream_options is not None and not req.stream:
            raise OpenAIError("stream_options: only allowed when stream is true", 400,
                              "stream_options")
        if req.stream and req.prompt_logprobs is not None:  # as vLLM: whole answers only
            raise OpenAIError("prompt_logprobs: not supported when stream is true", 400,
                              "prompt_logprobs")
        self.check_limit("n", req.n, "max_n")
        if best_of is not None:
            self.check_limit("best_of", best_of, "max_n")
        stop = [req.stop] if isinstance(req.stop, str) else req.stop or []
        self.check_limit("stop", len(stop), "max_stop_strings")
        self.check_limit("stop_token_ids", len(req.stop_token_ids or []), "max_stop_strings")
        # The sampler bans stop tokens by id until min_tokens: they must be real ids.
        self.check_token_ids(req.stop_token_ids or [], "stop_token_ids", allow_empty=True)
        max_logprobs = self.engine.config.max_logprobs
        for name, value in ((logprobs_param, logprobs), ("prompt_logprobs", prompt_logprobs)):
            if value is not None and value > max_logprobs:
                raise OpenAIError(f"{name} must be <= {max_logprobs} (--max-logprobs), "
                                  f"got {value}", 400, name)
        # A field the request leaves unset (None) takes the model's default, else ours.
        defaults = self.default_sampling

        def unset_default(value, name: str, fallback):
            return defaults.get(name, fallback) if value is None else value

        top_k = unset_default(req.top_k, "top_k", -1)
        structured_outputs = request_constraint(req)  # a bad schema: 400 naming its field
        try:
            return SamplingParams(
                n=req.n,
                best_of=best_of,
                temperature=unset_default(req.temperature, "temperature", 1.0),
                top_p=unset_default(req.top_p, "top_p", 1.0),
                top_k=-1 if top_k == 0 else top_k,  # vLLM: 0 also disables
                min_p=unset_default(req.min_p, "min_p", 0.0),
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
                repetition_penalty=unset_default(req.repetition_penalty, "repetition_penalty",
                                                 1.0),
                seed=req.seed,
                stop=req.stop,
                stop_token_ids=req.stop_token_ids,
                ignore_eos=req.ignore_eos,
                max_tokens=max_tokens,  # the model's cap applies in generate()
                min_tokens=req.min_tokens,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                skip_special_tokens=req.skip_special_tokens,
                include_stop_str_in_output=req.include_stop_str_in_output,
                # A stream sends what is new; a whole answer needs only the last output.
                output_kind=RequestOutputKind.DELTA if req.stream else RequestOutputKind.FINAL_ONLY,
                structured_outputs=structured_outputs,
            )
        except ValueError as e:  # SamplingParams names the field first
            raise OpenAIError(str(e), 400, str(e).split(" ", 1)[0]) from e

    # ---- prompts ------------------------------------------------------------------------

    def encode(self, text: str, param: str, add_special_tokens: bool = True) -> list[int]:
        try:
            text.encode()
        except UnicodeEncodeError as e:  # a lone surrogate ("\ud800" in JSON)
            raise OpenAIError(f"{param}: not valid Unicode ({e.reason})", 400, param) from e
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def render_chat(self, messages: list[ChatMessage], add_generation_prompt: bool,
                    tools: list[dict] | None = None) -> str:
        template = self.chat_template or self.tokenizer.chat_template
        if not template:
            raise OpenAIError("this model's tokenizer has no chat template: start the server "
                              "with --chat-template FILE", 400, "messages")
        conversation = [_template_message(m) for m in messages]
        try:
            return self.tokenizer.apply_chat_template(
                conversation, chat_template=template, tokenize=False,
                add_generation_prompt=add_generation_prompt, tools=tools)
        except jinja2.TemplateError as e:
            raise OpenAIError(f"the chat template failed: {e}", 400, "messages") from e

    def token_str(self, token_id: int, logprob: Logprob | None = None) -> str:
        if logprob is not None and logprob.decoded_token is not None:
            return logprob.decoded_token
        return self.tokenizer.decode([token_id])

    def prompt_logprobs(self, req: SamplingRequest, steps: list[dict[int, Logprob] | None]
                        ) -> PromptLogprobs | None:
        """vLLM's prompt_logprobs field, when the request asked for it."""
        if req.prompt_logprobs is None:
            return None
        return [None if step is None else {
            tid: PromptLogprob(logprob=max(lp.logprob, LOGPROB_FLOOR), rank=lp.rank,
                               decoded_token=self.token_str(tid, lp))
            for tid, lp in step.items()} for step in steps or []]

    # ---- engine calls -------------------------------------------------------------------

    def generate(self, request_id: str, prompt: str | None, token_ids: list[int],
                 params: SamplingParams, req: SamplingRequest) -> AsyncIterator[RequestOutput]:
        """One engine request, built here once: its sampling resolved (max_tokens under the
        model's max_new_tokens, as vLLM's server does) and the API request's per-request
        fields. A prompt that does not fit was turned away before (check_context)."""
        request = make_core_request(
            request_id, token_ids, params, self.max_model_len,
            max_tokens_cap=self.default_sampling.get("max_tokens"),
            priority=req.priority, cache_salt=req.cache_salt, user=req.user,
            ttft_slo_ms=req.ttft_slo_ms, e2e_slo_ms=req.e2e_slo_ms,
            oracle_output_len=req.oracle_output_len, lora_request=self.check_model(req.model))
        return self.engine.generate(request, params, request_id, prompt_text=prompt)


def _template_message(m: ChatMessage) -> dict:
    """A message as chat templates read it: an assistant's tool calls with their arguments
    as objects (templates write them with tojson; OpenAI sends JSON text)."""
    message = {"role": m.role, "content": m.text()}
    if m.tool_calls:
        calls = []
        for call in m.tool_calls:
            try:
                arguments = json.loads(call.function.arguments)
            except json.JSONDecodeError as e:
                raise OpenAIError(f"messages: tool call arguments are not JSON ({e})", 400,
                                  "messages") from e
            calls.append({"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": arguments}})
        message["tool_calls"] = calls
    if m.tool_call_id is not None:
        message["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        message["name"] = m.name
    return message
