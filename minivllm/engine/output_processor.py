"""OutputProcessor: the text half of the engine. It turns the core's per-step token deltas
(EngineCoreOutputs) into RequestOutputs — detokenizing, ending sequences at stop strings,
decoding logprob texts, grouping n / best_of sequences, in each request's output kind — and
fills the step's IterationStats (time to first token, inter-token latency, finished
requests). It runs wherever the caller is: in LLMEngine's process offline, in the API server
process (async_llm.py) while the core runs in its own.

The core does not know about stop strings: a sequence that one ends is reported in
ProcessedOutputs.stopped, and the caller tells the core to stop it (it may have generated a
token or two more meanwhile; they are dropped here).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from minivllm.engine.detokenizer import IncrementalDetokenizer, TokenTexts
from minivllm.engine.messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    seq_id,
    unpack_logprobs,
)
from minivllm.engine.parallel_sampling import num_sequences
from minivllm.engine.request_state import RequestGroup, RequestState
from minivllm.engine.stats import FinishedRequestStats, IterationStats
from minivllm.outputs import EmbeddingRequestOutput, RequestMetrics, RequestOutput
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class ProcessedOutputs:
    iteration_stats: IterationStats
    request_outputs: list[RequestOutput | EmbeddingRequestOutput] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)  # sequence ids a stop string ended
    failed: list[str] = field(default_factory=list)  # requests that failed here: abort them


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.token_texts = TokenTexts(tokenizer)
        self.groups: dict[str, RequestGroup] = {}  # by the caller's request id
        self._failed: list[RequestGroup] = []  # aborted or failed: answered next time

    def add_request(self, req: EngineCoreRequest, prompt: str | None,
                    params: SamplingParams) -> None:
        """Track a request sent to the core; `params` are the caller's (req's may ask for
        logprobs that best_of needs and the caller did not)."""
        core_params = req.sampling_params
        group = RequestGroup(
            request_id=req.request_id, prompt=prompt, prompt_token_ids=req.prompt_token_ids,
            n=params.n, with_logprobs=params.logprobs is not None,
            metrics=RequestMetrics(arrival_time=req.arrival_time), output_kind=params.output_kind,
            prompt_logprobs=[None] if params.prompt_logprobs is not None else None)
        for index in range(num_sequences(params)):
            group.sequences.append(RequestState(
                params=core_params, group_id=req.request_id, index=index,
                detokenizer=IncrementalDetokenizer(
                    self.tokenizer, req.prompt_token_ids, core_params.skip_special_tokens,
                    core_params.stop, core_params.include_stop_str_in_output),
                logprobs=[] if core_params.logprobs is not None else None))
        self.groups[req.request_id] = group

    def discard(self, request_id: str) -> None:
        """Forget a request the core turned away."""
        self.groups.pop(request_id, None)

    def abort_requests(self, request_ids: list[str]) -> None:
        """End requests here (the caller aborts them in the core); their last output and
        statistics come with the next process_outputs()."""
        for request_id in request_ids:
            group = self.groups.get(request_id)
            if group is not None:
                self._fail(group, error=None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups) or bool(self._failed)

    def _fail(self, group: RequestGroup, error: str | None) -> None:
        del self.groups[group.request_id]
        for state in group.sequences:
            if state.finish_reason is None:
                state.finish_reason = "abort"
        group.error = error
        group.metrics.finished_time = time.time()
        self._failed.append(group)

    def process_outputs(self, core_outputs: EngineCoreOutputs) -> ProcessedOutputs:
        now = core_outputs.timestamp
        result = ProcessedOutputs(IterationStats(
            timestamp=now, num_prompt_tokens=core_outputs.num_prompt_tokens))
        progressed: dict[str, RequestGroup] = {}
        for out in core_outputs.outputs:
            group = self.groups.get(out.request_id)
            if group is None:  # aborted or failed here while the core was stepping
                continue
            if out.error is not None:
                self._fail(group, out.error)
                progressed.pop(group.request_id, None)
                continue
            state = group.sequences[out.index]
            if state.finish_reason is not None:  # a stop string ended it; the core lagged
                continue
            try:
                self._append_tokens(state, group, out, now, result.iteration_stats)
            except Exception as exc:  # one request's failure must not take down the others
                logger.exception("request %s failed", group.request_id)
                self._fail(group, error=f"{type(exc).__name__}: {exc}")
                progressed.pop(group.request_id, None)
                result.failed.append(group.request_id)
                continue
            if state.finish_reason is not None and out.finish_reason is None:
                result.stopped.append(seq_id(group.request_id, out.index, len(group.sequences)))
            if out.new_token_ids or out.pooled is not None:
                progressed[group.request_id] = group
        failed, self._failed = self._failed, []
        for group in progressed.values():
            if group.finished:
                group.metrics.finished_time = now
                del self.groups[group.request_id]
        for group in failed + list(progressed.values()):
            if group.finished:
                self._record_finished(group, result.iteration_stats)
            output = group.to_output(self.token_texts)
            if output is not None:
                result.request_outputs.append(output)
        return result

    def _append_tokens(self, state: RequestState, group: RequestGroup, out: EngineCoreOutput,
                       now: float, iteration: IterationStats) -> None:
        """Account for a sequence's new tokens; set its finish reason when it is done."""
        metrics = group.metrics
        if metrics.first_scheduled_time is None and out.first_scheduled_time is not None:
            metrics.first_scheduled_time = out.first_scheduled_time
            metrics.time_in_queue = out.first_scheduled_time - metrics.arrival_time
        if out.prefill_steps:
            metrics.prefill_steps = out.prefill_steps
            metrics.prefill_step_tokens = out.prefill_step_tokens
        if out.prompt_logprobs is not None:
            first, scored = out.prompt_logprobs
            group.add_prompt_logprobs(first, [unpack_logprobs(entry) for entry in scored])
        if out.pooled is not None:  # a pooling request's one output: it has no tokens
            group.pooled, group.num_cached_tokens = out.pooled, out.num_cached_tokens
            state.finish_reason = out.finish_reason
            return
        if not out.new_token_ids:
            return
        group.num_cached_tokens = out.num_cached_tokens
        last = len(out.new_token_ids) - 1
        for i, token in enumerate(out.new_token_ids):
            iteration.num_generation_tokens += 1
            if metrics.first_token_time is None:
                metrics.first_token_time = now
                iteration.time_to_first_tokens.append(now - metrics.arrival_time)
            elif metrics.last_token_time != now:  # one latency per step, not per sequence
                iteration.inter_token_latencies.append(now - metrics.last_token_time)
            metrics.last_token_time = now
            state.output_token_ids.append(token)
            if out.new_logprobs is not None and state.logprobs is not None:
                entry = unpack_logprobs(out.new_logprobs[i])
                state.logprobs.append(entry)
                state.cumulative_logprob += entry[token].logprob
            delta = state.detokenizer.add_token(token)
            # The core's stops in its order — EOS, a stop token — come before stop
            # strings, and stop strings before the length limit.
            if i == last and out.finish_reason == "stop":
                state.finish_reason, state.stop_reason = "stop", out.stop_reason
            elif (len(state.output_token_ids) >= state.params.min_tokens
                  and (stop := state.detokenizer.find_stop(len(delta))) is not None):
                state.finish_reason, state.stop_reason = "stop", stop
            elif i == last:
                state.finish_reason = out.finish_reason
            if state.finish_reason is not None:
                return

    @staticmethod
    def _record_finished(group: RequestGroup, iteration: IterationStats) -> None:
        m = group.metrics  # a request aborted while waiting was never scheduled
        scheduled = m.first_scheduled_time or m.finished_time
        first_token = m.first_token_time or m.finished_time
        iteration.finished_requests.append(FinishedRequestStats(
            finish_reason=group.sequences[0].finish_reason,
            num_prompt_tokens=len(group.prompt_token_ids),
            num_generation_tokens=sum(len(s.output_token_ids) for s in group.sequences),
            e2e_latency=m.finished_time - m.arrival_time,
            queue_time=scheduled - m.arrival_time,
            prefill_time=first_token - scheduled,
            decode_time=m.finished_time - first_token,
        ))
