"""LLMEngine: add_request / abort_request / step. Glues the scheduler (core/) to the model
runner (model/): each step schedules (a SchedulerOutput of data and diffs), runs one forward
and samples (plain data back), detokenizes, checks stops and returns the outputs of the
requests that progressed — in each request's output kind: cumulative, final only, or only
what is new."""

from __future__ import annotations

import dataclasses
import logging
import time

from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from minivllm.config import EngineConfig
from minivllm.core.policy import make_policy
from minivllm.core.request import Request, RequestStatus, check_context_length
from minivllm.core.scheduler import Scheduler, SchedulerConfig
from minivllm.engine.detokenizer import IncrementalDetokenizer, TokenTexts
from minivllm.engine.errors import EngineOverloadedError
from minivllm.engine.request_state import RequestGroup, RequestState
from minivllm.engine.stats import FinishedRequestStats, IterationStats, SchedulerStats
from minivllm.model.loader import resolve_model_path
from minivllm.model.runner import ModelRunner
from minivllm.outputs import Logprob, RequestMetrics, RequestOutput
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
        self.token_texts = TokenTexts(self.tokenizer)
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
        self.groups: dict[str, RequestGroup] = {}  # by the caller's request id
        self.states: dict[str, RequestState] = {}  # by sequence id
        self._failed: list[RequestGroup] = []  # aborted or failed: answered next step
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
        if request_id in self.groups:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if prompt_token_ids is None:
            if prompt is None:
                raise ValueError("either prompt or prompt_token_ids is required")
            prompt_token_ids = self.tokenizer(prompt).input_ids
        self._validate(prompt_token_ids, params)
        check_context_length(len(prompt_token_ids), params.max_tokens, self.max_model_len)
        max_tokens = params.max_tokens
        if max_tokens is None:  # the rest of the context
            max_tokens = self.max_model_len - len(prompt_token_ids)
        self.scheduler.check_fits(len(prompt_token_ids), max_tokens, params.best_of or params.n)
        self._check_queue_bounds(len(prompt_token_ids))
        arrival_time = arrival_time if arrival_time is not None else time.time()
        num_seqs = params.best_of or params.n
        group = RequestGroup(
            request_id=request_id, prompt=prompt, prompt_token_ids=list(prompt_token_ids),
            n=params.n, with_logprobs=params.logprobs is not None,
            metrics=RequestMetrics(arrival_time=arrival_time), output_kind=params.output_kind,
            prompt_logprobs=[None] if params.prompt_logprobs is not None else None)
        if num_seqs > params.n and params.logprobs is None:  # best_of ranks by logprob
            params = dataclasses.replace(params, logprobs=0)
        banned = self._stop_ids(params)  # until min_tokens
        for index in range(num_seqs):
            seq_id = request_id if num_seqs == 1 else f"{request_id}#{index}"
            request = Request(
                seq_id, prompt_token_ids, max_tokens, arrival_time, priority, cache_salt,
                needs_prompt_logits=params.prompt_logprobs is not None and index == 0,
                sampling_params=params, banned_until_min_tokens=banned,
                seed=None if params.seed is None else params.seed + index)
            group.sequences.append(RequestState(
                request=request, params=params, group_id=request_id, index=index,
                detokenizer=IncrementalDetokenizer(
                    self.tokenizer, prompt_token_ids, params.skip_special_tokens,
                    params.stop, params.include_stop_str_in_output),
                logprobs=[] if params.logprobs is not None else None))
        head = group.sequences[0].request
        for state in group.sequences[1:]:
            state.request.group = head.group
            head.group.append(state.request)
            head.pending_forks.append(state.request)
        self.scheduler.add_request(head)
        self.groups[request_id] = group
        for state in group.sequences:
            self.states[state.request.request_id] = state

    def _validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if not prompt_token_ids:
            raise ValueError("prompt must not be empty")
        bad = [t for t in prompt_token_ids
               if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size}), got {bad[0]!r}")
        bad = [t for t in params.stop_token_ids if t >= self.vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids must be in [0, {self.vocab_size}), got {bad[0]}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > self.config.max_logprobs:
                raise ValueError(f"{name} must be <= {self.config.max_logprobs}, got {value}")

    def _check_queue_bounds(self, num_prompt_tokens: int) -> None:
        """Turn a new request away while the waiting queue is at its bounds."""
        waiting, config = self.scheduler.waiting, self.config
        limit = config.max_num_waiting_requests
        if limit is not None and len(waiting) >= limit:
            raise EngineOverloadedError(
                f"{len(waiting)} requests are waiting, the limit is {limit} "
                "(max_num_waiting_requests)", "max_num_waiting_requests")
        limit = config.max_num_waiting_tokens
        if limit is not None and waiting:  # alone in the queue, any prompt may wait
            queued = sum(r.num_tokens for r in waiting)
            if queued + num_prompt_tokens > limit:
                raise EngineOverloadedError(
                    f"{queued} tokens are waiting and this prompt has {num_prompt_tokens}, the "
                    f"limit is {limit} (max_num_waiting_tokens)", "max_num_waiting_tokens")

    def _expire_waiting(self, now: float) -> None:
        """Fail the requests that waited, never scheduled, longer than request_timeout."""
        timeout = self.config.request_timeout
        for request in [r for r in self.scheduler.waiting if now - r.arrival_time > timeout]:
            group = self.groups[self.states[request.request_id].group_id]
            if group.metrics.first_scheduled_time is None:
                self._fail_group(group.request_id, error=(
                    f"request timed out: it waited {now - request.arrival_time:.1f}s in the "
                    f"queue, longer than request_timeout={timeout}s"))

    def abort_request(self, request_id: str | list[str]) -> None:
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            self._fail_group(rid, error=None)

    def _fail_group(self, group_id: str, error: str | None) -> None:
        """Abort every unfinished sequence of a request; its output is returned next step."""
        group = self.groups.pop(group_id, None)
        if group is None:
            return
        for state in group.sequences:
            self.states.pop(state.request.request_id, None)
            if state.finish_reason is None:
                self.scheduler.finish_request(state.request, RequestStatus.FINISHED_ABORTED)
                state.finish_reason = "abort"
        group.error = error
        group.metrics.finished_time = time.time()
        self._failed.append(group)

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups) or bool(self._failed)

    def add_stat_logger(self, stat_logger) -> None:
        self.stat_loggers.append(stat_logger)

    # ---- one step ---------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        if self.config.request_timeout is not None:
            self._expire_waiting(time.time())
        sched_out = self.scheduler.schedule()
        now = time.time()
        iteration = IterationStats(timestamp=now)
        for req_id, num_new in sched_out.num_scheduled_tokens.items():
            request = self.scheduler.requests[req_id]
            group = self.groups[self.states[req_id].group_id]
            if group.metrics.first_scheduled_time is None:
                group.metrics.first_scheduled_time = now
                group.metrics.time_in_queue = now - group.metrics.arrival_time
            start = request.num_computed_tokens
            iteration.num_prompt_tokens += max(0, min(start + num_new,
                                                      request.num_prompt_tokens) - start)
        result = self.runner.execute(sched_out)
        for seq_id, (first, scored) in result.prompt_logprobs.items():
            self.groups[self.states[seq_id].group_id].add_prompt_logprobs(first, scored)
        progressed: dict[str, RequestGroup] = {}
        now = time.time()
        for request in self.scheduler.update_from_output(sched_out, result.sampled_token_ids):
            state = self.states[request.request_id]
            group = self.groups[state.group_id]
            try:
                status = self._append_token(state, group, result.logprobs.get(request.request_id),
                                            now, iteration)
            except Exception as exc:  # one request's failure must not take down the others
                logger.exception("request %s failed", state.group_id)
                self._fail_group(state.group_id, error=f"{type(exc).__name__}: {exc}")
                progressed.pop(state.group_id, None)
                continue
            progressed[state.group_id] = group
            if status is not None:
                self.scheduler.finish_request(request, status)
                del self.states[request.request_id]
        failed, self._failed = self._failed, []
        for group in progressed.values():
            if group.finished:
                group.metrics.finished_time = now
                del self.groups[group.request_id]
        outputs = []
        for group in failed + list(progressed.values()):
            if group.finished:
                self._record_finished(group, iteration)
            output = group.to_output(self.token_texts)
            if output is not None:
                outputs.append(output)
        self._log_stats(iteration)
        return outputs

    def _stop_ids(self, params: SamplingParams) -> tuple[int, ...]:
        """The tokens that end a sequence, banned by the sampler while it is below min_tokens."""
        ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            ids |= self.eos_token_ids
        return tuple(sorted(ids))

    def _append_token(self, state: RequestState, group: RequestGroup,
                      logprobs: dict[int, Logprob] | None, now: float,
                      iteration: IterationStats) -> RequestStatus | None:
        """Account for the token the scheduler appended; return the finished status if the
        sequence is done."""
        request, params = state.request, state.params
        token = request.output_token_ids[-1]
        iteration.num_generation_tokens += 1
        metrics = group.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
            iteration.time_to_first_tokens.append(now - metrics.arrival_time)
        elif metrics.last_token_time != now:  # one latency per step, not per sequence
            iteration.inter_token_latencies.append(now - metrics.last_token_time)
        metrics.last_token_time = now
        if logprobs is not None:
            state.logprobs.append(logprobs)
            state.cumulative_logprob += logprobs[token].logprob
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
        return (RequestStatus.FINISHED_STOPPED if state.finish_reason == "stop"
                else RequestStatus.FINISHED_LENGTH)

    @staticmethod
    def _record_finished(group: RequestGroup, iteration: IterationStats) -> None:
        m = group.metrics  # a request aborted while waiting was never scheduled
        scheduled = m.first_scheduled_time or m.finished_time
        first_token = m.first_token_time or m.finished_time
        iteration.finished_requests.append(FinishedRequestStats(
            finish_reason=group.sequences[0].finish_reason,
            num_prompt_tokens=len(group.prompt_token_ids),
            num_generation_tokens=sum(s.request.num_output_tokens for s in group.sequences),
            e2e_latency=m.finished_time - m.arrival_time,
            queue_time=scheduled - m.arrival_time,
            prefill_time=first_token - scheduled,
            decode_time=m.finished_time - first_token,
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
