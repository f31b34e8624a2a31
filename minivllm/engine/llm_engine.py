"""LLMEngine: add_request / abort_request / step, synchronously, in one process (the offline
`LLM`). It composes the two halves that the server runs apart (async_llm.py over an
EngineCoreClient): the EngineCore (scheduler, KV cache, model runner: token ids in, token
ids out) and the OutputProcessor (detokenization, stop strings, RequestOutputs in each
request's output kind, per-request metrics), closing each step with the same rule
(frontend.process_outputs)."""

from __future__ import annotations

import weakref

from minivllm.config import EngineConfig
from minivllm.core.scheduler_stats import SchedulerStats
from minivllm.engine.core import EngineCore
from minivllm.engine.frontend import build_request, check_runner, process_outputs
from minivllm.engine.messages import EngineCoreRequest
from minivllm.engine.output_processor import OutputProcessor
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.core = EngineCore(config)
        # No close() to call offline: when this engine is collected (or the interpreter
        # exits) its core shuts down as the server's does (the disk tier's flush).
        weakref.finalize(self, self.core.shutdown)
        self.tokenizer = self.core.tokenizer
        self.max_model_len = self.core.max_model_len
        self.vocab_size = self.core.vocab_size
        self.output_processor = OutputProcessor(self.tokenizer)
        self.groups = self.output_processor.groups  # by the caller's request id

    @property
    def scheduler(self):
        return self.core.scheduler

    @property
    def runner(self):
        return self.core.runner

    def add_request(self, request_id: str, prompt: str | EngineCoreRequest | None,
                    params: SamplingParams, prompt_token_ids: list[int] | None = None,
                    priority: int = 0, arrival_time: float | None = None,
                    prompt_text: str | None = None) -> None:
        """As AsyncLLM.generate: `prompt` is the text (or None with prompt_token_ids), or an
        EngineCoreRequest an edge built, whose text, if any, is `prompt_text`; `params` are
        the caller's. `arrival_time` (default: now) is for a prompt only."""
        if request_id in self.groups:
            raise ValueError(f"request_id {request_id!r} is already in use")
        request, prompt = build_request(prompt, params, request_id, prompt_token_ids, priority,
                                        prompt_text, self.tokenizer, arrival_time)
        check_runner(request, self.config.model_config)
        self.core.add_request(request)  # raises for input it rejects, leaving nothing behind
        self.output_processor.add_request(request, prompt, params)

    def abort_request(self, request_id: str | list[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self.core.abort_requests(ids)
        self.output_processor.abort_requests(ids)

    def has_unfinished_requests(self) -> bool:
        return (self.core.has_unfinished_requests()
                or self.output_processor.has_unfinished_requests())

    def step(self) -> list[RequestOutput]:
        return process_outputs(self.output_processor, self.core.step(),
                               self.core).request_outputs

    def get_stats(self) -> SchedulerStats:
        return self.core.get_stats()

    def reset_prefix_cache(self, reset_external: bool = False) -> bool:
        return self.core.reset_prefix_cache(reset_external)
