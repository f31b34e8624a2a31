"""The offline API, spelled like vLLM's: LLM(model=...).generate(prompts, sampling_params)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from tqdm.auto import tqdm

from minivllm.beam_search import (
    BeamSearch,
    BeamSearchOutput,
    advance_all,
    check_beam_search,
    step_params,
)
from minivllm.config import EngineConfig
from minivllm.core.request import check_context_length
from minivllm.core.scheduler_stats import SchedulerStats
from minivllm.engine.generation_defaults import describe, load_sampling_defaults
from minivllm.engine.llm_engine import LLMEngine
from minivllm.engine.messages import make_core_request, make_pooling_request
from minivllm.lora.request import LoRARequest
from minivllm.outputs import EmbeddingRequestOutput, RequestOutput
from minivllm.pooling_params import PoolingParams
from minivllm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

PromptType = str | dict[str, Any]
logger = logging.getLogger(__name__)


def _per_prompt(value, num_prompts: int, name: str) -> list:
    """One value for every prompt, or a sequence of one per prompt."""
    if value is None or isinstance(value, (str, int, float, LoRARequest)):
        return [value] * num_prompts
    if len(value) != num_prompts:
        raise ValueError(f"got {len(value)} {name} values for {num_prompts} prompts")
    return list(value)


class LLM:
    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        if model is not None:
            kwargs["model"] = model
        self.llm_engine = LLMEngine(EngineConfig.from_kwargs(**kwargs))
        self._counter = itertools.count()
        # The model's recommended sampling (generation_config.json; --generation-config)
        self._sampling_defaults, source = load_sampling_defaults(self.llm_engine.config)
        if self._sampling_defaults:
            logger.info(describe(self._sampling_defaults, source))

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation config defaults (temperature, top_p,
        top_k, min_p, repetition_penalty, max_new_tokens as max_tokens) where it sets them,
        SamplingParams' own elsewhere; what generate() and chat() use when given none."""
        return SamplingParams(**self._sampling_defaults)

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def stats(self) -> SchedulerStats:
        return self.llm_engine.get_stats()

    def reset_prefix_cache(self, reset_external: bool = False) -> bool:
        """Forget the prefix cache: a prompt served before is computed again. With
        `reset_external`, the disk tier's block files are deleted too (vLLM's
        POST /reset_prefix_cache?reset_external=true)."""
        return self.llm_engine.reset_prefix_cache(reset_external)

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
        user: str | Sequence[str | None] | None = None,
        ttft_slo_ms: float | Sequence[float | None] | None = None,
        e2e_slo_ms: float | Sequence[float | None] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """`user` (vtc's tenant), `ttft_slo_ms` and `e2e_slo_ms` (edf's deadlines),
        `lora_request` (the adapter, with LLM(enable_lora=True)): one value for every prompt,
        or one per prompt."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"got {len(sampling_params)} sampling_params for {len(prompts)} prompts")
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"got {len(priority)} priorities for {len(prompts)} prompts")
        scheduling = {name: _per_prompt(value, len(prompts), name) for name, value in
                      (("user", user), ("ttft_slo_ms", ttft_slo_ms), ("e2e_slo_ms", e2e_slo_ms),
                       ("lora_request", lora_request))}
        def requests():
            for i, (prompt, params) in enumerate(zip(prompts, sampling_params)):
                # Offline, only the finished output is wanted: no per-step copies.
                params = dataclasses.replace(params, output_kind=RequestOutputKind.FINAL_ONLY)
                request_id = str(next(self._counter))
                text, token_ids = self._prompt_ids(prompt)
                check_context_length(len(token_ids), params.max_tokens,
                                     self.llm_engine.max_model_len)
                yield request_id, make_core_request(
                    request_id, token_ids, params, self.llm_engine.max_model_len,
                    priority=priority[i] if priority else 0,
                    **{k: v[i] for k, v in scheduling.items()}), params, text

        return self._add_and_run(requests(), use_tqdm)

    def beam_search(self, prompts: PromptType | Sequence[PromptType],
                    params: BeamSearchParams, use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """vLLM's: each prompt's beam_width best hypotheses, as transformers' beam search
        finds them (minivllm/beam_search.py). Every step runs each live beam of every prompt
        as one request of one token; they share their KV blocks through the prefix cache."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        core = self.llm_engine.core
        searches = []
        for prompt in prompts:
            _, token_ids = self._prompt_ids(prompt)
            check_beam_search(params, core.eos_token_ids, self.llm_engine.config.max_logprobs,
                              len(token_ids), self.llm_engine.max_model_len)
            searches.append(BeamSearch(token_ids, params, core.eos_token_ids))
        step = step_params(searches[0].num_candidates) if searches else None
        bar = tqdm(desc="Beam search steps", disable=not use_tqdm)
        while live := [s for s in searches if not s.done]:
            beams = [{"prompt_token_ids": ids} for s in live for ids in s.beam_token_ids()]
            advance_all(live, self.generate(beams, step, use_tqdm=False))
            bar.update(1)
        bar.close()
        return [s.output(self.get_tokenizer().decode) for s in searches]

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tokenizer = self.get_tokenizer()
        if chat_template is None and not tokenizer.chat_template:
            raise ValueError("this model's tokenizer has no chat template: pass one, "
                             "llm.chat(messages, chat_template=\"{% for m in messages %}...\"), "
                             "or use llm.generate with a plain prompt")
        prompts = [
            {"prompt_token_ids": tokenizer.apply_chat_template(
                conversation, chat_template=chat_template, tokenize=True,
                add_generation_prompt=add_generation_prompt, return_dict=False)}
            for conversation in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm)

    def embed(self, prompts: PromptType | Sequence[PromptType],
              pooling_params: PoolingParams | None = None, use_tqdm: bool = True,
              lora_request: LoRARequest | None = None) -> list[EmbeddingRequestOutput]:
        """vLLM's: each prompt pooled into one vector (`.outputs.embedding`), as
        --pooler-config says unless `pooling_params` (dimensions, normalize, pooling_type)
        do. Pooling requests share the scheduler and the steps with generation."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        def requests():
            for prompt in prompts:
                request_id = str(next(self._counter))
                text, token_ids = self._prompt_ids(prompt)
                request = make_pooling_request(request_id, token_ids,
                                               pooling_params or PoolingParams(),
                                               lora_request=lora_request)
                yield request_id, request, request.sampling_params, text

        return self._add_and_run(requests(), use_tqdm)

    def _add_and_run(self, requests: Iterator[tuple], use_tqdm: bool) -> list:
        """Add each (request id, EngineCoreRequest, SamplingParams, prompt text) and run them
        to the end; if one cannot be added, the ones added are aborted and the error raised."""
        ids = []
        try:
            for request_id, request, params, text in requests:
                self.llm_engine.add_request(request_id, request, params, prompt_text=text)
                ids.append(request_id)
        except Exception:
            self.llm_engine.abort_request(ids)
            self._run(set(ids), use_tqdm=False)
            raise
        return self._run(set(ids), use_tqdm)

    def _prompt_ids(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """The prompt's text (if any) and token ids, tokenized here when given as text."""
        text, token_ids = self._split_prompt(prompt)
        if token_ids is None:
            token_ids = self.llm_engine.tokenizer(text).input_ids
        return text, token_ids

    @staticmethod
    def _split_prompt(prompt: PromptType) -> tuple[str | None, list[int] | None]:
        if isinstance(prompt, str):
            return prompt, None
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        if isinstance(prompt, dict) and "prompt" in prompt:
            return prompt["prompt"], None
        raise ValueError(f"a prompt must be a str or a dict with prompt_token_ids, got {prompt!r}")

    def _run(self, ids: set[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Processed prompts", disable=not use_tqdm)
        while self.llm_engine.has_unfinished_requests():
            for output in self.llm_engine.step():
                if output.finished and output.request_id in ids:
                    finished[output.request_id] = output
                    bar.update(1)
        bar.close()
        return [finished[i] for i in sorted(finished, key=int)]
