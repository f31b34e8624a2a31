"""LLMEngine: add_request / abort_request / step. Glues the scheduler (core/) to the model
runner (model/): each step schedules, runs one forward, samples, detokenizes, checks stops
and returns the outputs of the requests that progressed."""

from __future__ import annotations

import logging
import time

from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from minivllm.config import EngineConfig
from minivllm.core.policy import make_policy
from minivllm.core.request import Request, RequestStatus
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.engine.request_state import RequestState
from minivllm.engine.stats import FinishedRequestStats, IterationStats, SchedulerStats
from minivllm.model.loader import resolve_model_path
from minivllm.model.runner import ModelRunner
from minivllm.model.sampler import SamplingRow
from minivllm.outputs import RequestMetrics, RequestOutput
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


def _eos_token_ids(path, tokenizer) -> set[int]:
    ids: set[int] = set()
    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    except OSError:  # no generation_config.json
        pass
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        path = resolve_model_path(config.model, config.revision)
        self.hf_config = AutoConfig.from_pretrained(path)
        tokenizer_path = resolve_model_path(config.tokenizer) if config.tokenizer else path
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.eos_token_ids = _eos_token_ids(path, self.tokenizer)
        self.max_model_len = self._max_model_len()
        self.runner = ModelRunner(config, path, self.hf_config)
        self.vocab_size = self.hf_config.vocab_size
        policy = make_policy(config.scheduling_policy, config.priority_aging_s)
        self.scheduler = Scheduler(SchedulerConfig(
            num_blocks=self.runner.num_blocks,
            block_size=config.block_size,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            num_swap_blocks=self.runner.num_swap_blocks,
            enable_prefix_caching=config.enable_prefix_caching,
            enable_chunked_prefill=config.enable_chunked_prefill,
            preemption_mode=config.preemption_mode,
            active_preemption=config.active_preemption,
            min_run_quantum=config.min_run_quantum,
        ), policy)
        self.states: dict[str, RequestState] = {}
        self._finished_outside_step: list[RequestOutput] = []
        self.stat_loggers: list = []
        logger.info("minivllm engine: model %s, %d KV blocks of %d tokens, %d swap blocks, %s",
                    path, self.runner.num_blocks, config.block_size, self.runner.num_swap_blocks,
                    self.runner.dtype)

    def _max_model_len(self) -> int:
        limit = getattr(self.hf_config, "max_position_embeddings", 2048)
        window = getattr(self.hf_config, "sliding_window", None)
        if window and getattr(self.hf_config, "use_sliding_window", True):
            limit = min(limit, window)  # no sliding-window attention: stay inside the window
        if self.config.max_model_len is not None:
            if self.config.max_model_len > limit:
                raise ValueError(f"max_model_len ({self.config.max_model_len}) exceeds the "
                                 f"model's limit ({limit})")
            return self.config.max_model_len
        return limit

    # ---- requests ---------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | None, params: SamplingParams,
                    prompt_token_ids: list[int] | None = None, priority: int = 0,
                    arrival_time: float | None = None, cache_salt: str | None = None) -> None:
        if prompt_token_ids is None:
            if prompt is None:
                raise ValueError("either prompt or prompt_token_ids is required")
            prompt_token_ids = self.tokenizer(prompt).input_ids
        if not prompt_token_ids:
            raise ValueError("prompt must not be empty")
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size}), got {bad[0]!r}")
        if params.n != 1:
            raise ValueError(f"n must be 1, got {params.n}")
        if params.logprobs is not None and params.logprobs > self.config.max_logprobs:
            raise ValueError(f"logprobs must be <= {self.config.max_logprobs}, got {params.logprobs}")
        if (params.prompt_logprobs is not None
                and params.prompt_logprobs > self.config.max_logprobs):
            raise ValueError(f"prompt_logprobs must be <= {self.config.max_logprobs}, "
                             f"got {params.prompt_logprobs}")
        max_tokens = params.max_tokens
        if max_tokens is None:  # the rest of the context
            max_tokens = self.max_model_len - len(prompt_token_ids)
            if max_tokens < 1:
                raise ValueError(f"prompt ({len(prompt_token_ids)} tokens) leaves no room in "
                                 f"the context (max_model_len={self.max_model_len})")
        arrival_time = arrival_time if arrival_time is not None else time.time()
        request = Request(request_id, prompt_token_ids, max_tokens, arrival_time, priority,
                          cache_salt, needs_prompt_logits=params.prompt_logprobs is not None)
        self.scheduler.add_request(request)
        self.states[request_id] = RequestState(
            request=request, params=params, prompt=prompt,
            detokenizer=IncrementalDetokenizer(
                self.tokenizer, prompt_token_ids, params.skip_special_tokens,
                params.stop, params.include_stop_str_in_output),
            generator=self.runner.make_generator(params.seed) if params.seed is not None else None,
            metrics=RequestMetrics(arrival_time=arrival_time),
            logprobs=[] if params.logprobs is not None else None,
            prompt_logprobs=[None] if params.prompt_logprobs is not None else None,
        )

    def abort_request(self, request_id: str | list[str]) -> None:
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            self._finish(rid, RequestStatus.FINISHED_ABORTED)

    def _finish(self, request_id: str, status: RequestStatus, error: str | None = None) -> None:
        state = self.states.pop(request_id, None)
        if state is None:
            return
        self.scheduler.finish_request(state.request, status)
        state.finish_reason = status.value
        state.error = error
        state.metrics.finished_time = time.time()
        self._finished_outside_step.append(state.to_output(self.tokenizer))

    def has_unfinished_requests(self) -> bool:
        return bool(self.states) or bool(self._finished_outside_step)

    def add_stat_logger(self, stat_logger) -> None:
        self.stat_loggers.append(stat_logger)

    # ---- one step ---------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        outputs, self._finished_outside_step = self._finished_outside_step, []
        sched_out = self.scheduler.schedule()
        now = time.time()
        iteration = IterationStats(timestamp=now)
        for s in sched_out.scheduled:
            state = self.states[s.request.request_id]
            if state.metrics.first_scheduled_time is None:
                state.metrics.first_scheduled_time = now
                state.metrics.time_in_queue = now - state.metrics.arrival_time
            start = s.request.num_computed_tokens
            prompt_end = min(start + s.num_new_tokens, s.request.num_prompt_tokens)
            iteration.num_prompt_tokens += max(0, prompt_end - start)
        rows = {s.request.request_id: self._sampling_row(s.request.request_id)
                for s in sched_out.scheduled}
        stop_ids = {rid: self._stop_ids(rid) for rid in rows}
        result = self.runner.execute(sched_out, rows, stop_ids)
        for request_id, (first, scored) in result.prompt_logprobs.items():
            self.states[request_id].add_prompt_logprobs(first, scored)
        sampled = self.scheduler.update_after_step(sched_out)
        now = time.time()
        for request in sampled:
            state = self.states[request.request_id]
            try:
                finished = self._append_token(state, result.sampled[request.request_id], now,
                                              iteration)
            except Exception as exc:  # one request's failure must not take down the others
                logger.exception("request %s failed", request.request_id)
                self._finish(request.request_id, RequestStatus.FINISHED_ABORTED,
                             error=f"{type(exc).__name__}: {exc}")
                continue
            if finished:
                self._record_finished(state, iteration)
                self.scheduler.finish_request(request, finished)
                del self.states[request.request_id]
            outputs.append(state.to_output(self.tokenizer))
        outputs.extend(self._finished_outside_step)
        self._finished_outside_step = []
        self._log_stats(iteration)
        return outputs

    def _sampling_row(self, request_id: str) -> SamplingRow:
        state = self.states[request_id]
        r = state.request
        return SamplingRow(state.params, state.generator, r.prompt_token_ids, r.output_token_ids)

    def _stop_ids(self, request_id: str) -> set[int]:
        params = self.states[request_id].params
        ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            ids |= self.eos_token_ids
        return ids

    def _append_token(self, state: RequestState, sample, now: float,
                      iteration: IterationStats) -> RequestStatus | None:
        """Add the sampled token; return the finished status if the request is done."""
        request, params, token = state.request, state.params, sample.token_id
        request.append_output_token(token)
        iteration.num_generation_tokens += 1
        if state.metrics.first_token_time is None:
            state.metrics.first_token_time = now
            iteration.time_to_first_tokens.append(now - state.metrics.arrival_time)
        else:
            iteration.inter_token_latencies.append(now - state.metrics.last_token_time)
        state.metrics.last_token_time = now
        if sample.logprobs is not None:
            state.logprobs.append(sample.logprobs)
            state.cumulative_logprob += sample.logprobs[token].logprob
        delta = state.detokenizer.add_token(token)
        can_stop = request.num_output_tokens >= params.min_tokens
        if can_stop and not params.ignore_eos and token in self.eos_token_ids:
            state.finish_reason = "stop"
        elif can_stop and token in params.stop_token_ids:
            state.finish_reason, state.stop_reason = "stop", token
        elif can_stop and (stop := state.detokenizer.find_stop(len(delta))) is not None:
            state.finish_reason, state.stop_reason = "stop", stop
        elif (request.num_output_tokens >= request.max_tokens
              or request.num_tokens >= self.max_model_len):
            state.finish_reason = "length"
        if state.finish_reason is None:
            return None
        state.metrics.finished_time = now
        return (RequestStatus.FINISHED_STOPPED if state.finish_reason == "stop"
                else RequestStatus.FINISHED_LENGTH)

    def _record_finished(self, state: RequestState, iteration: IterationStats) -> None:
        m = state.metrics
        iteration.finished_requests.append(FinishedRequestStats(
            finish_reason=state.finish_reason,
            num_prompt_tokens=state.request.num_prompt_tokens,
            num_generation_tokens=state.request.num_output_tokens,
            e2e_latency=m.finished_time - m.arrival_time,
            queue_time=m.first_scheduled_time - m.arrival_time,
            prefill_time=m.first_token_time - m.first_scheduled_time,
            decode_time=m.finished_time - m.first_token_time,
        ))

    # ---- statistics -------------------------------------------------------------------

    def get_stats(self) -> SchedulerStats:
        s, kv = self.scheduler, self.scheduler.kv
        return SchedulerStats(
            num_running=len(s.running), num_waiting=len(s.waiting), num_swapped=len(s.swapped),
            num_total_blocks=kv.num_blocks, num_free_blocks=kv.num_free_blocks,
            kv_cache_usage=kv.usage, num_total_swap_blocks=kv.num_swap_blocks,
            num_free_swap_blocks=len(kv.free_swap_blocks), num_preemptions=s.num_preemptions,
            prefix_cache_queries=kv.prefix_cache_queries, prefix_cache_hits=kv.prefix_cache_hits,
        )

    def _log_stats(self, iteration: IterationStats) -> None:
        if not self.stat_loggers:
            return
        stats = self.get_stats()
        for stat_logger in self.stat_loggers:
            stat_logger.record(stats, iteration)
