"""EngineCore: the scheduler, the KV bookkeeping and the model runner — everything that works
on token ids. add_request / abort_requests / step; each step returns plain data
(EngineCoreOutputs): the tokens each sequence got, their logprobs, which sequences finished
and why (EOS, a stop token, max_tokens, the context length), and the step's statistics.

Text is not its business: detokenization, stop strings and RequestOutputs are the
OutputProcessor's (output_processor.py), in the same process (LLMEngine) or in the API
server's (core_proc.py / async_llm.py).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent import futures

import msgspec
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from minivllm.config import EngineConfig
from minivllm.core.lifecycle import LifecycleTracer, TraceSample
from minivllm.core.policies.edf import own_deadlines
from minivllm.core.request import Request, RequestStatus, check_context_length
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.core.scheduler_stats import SchedulerStats
from minivllm.core.step import EngineStep, ScheduledStep
from minivllm.engine.errors import EngineOverloadedError
from minivllm.engine.messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    pack_logprobs,
    resolve_max_tokens,
)
from minivllm.engine.parallel_sampling import CoreRequests, make_sequences, num_sequences
from minivllm.lora.manager import LoRAManager
from minivllm.lora.request import LoRARequest
from minivllm.model.loader import resolve_model_path
from minivllm.model.runner import ModelRunner, ModelRunnerOutput
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output.manager import StructuredOutputManager

logger = logging.getLogger(__name__)


def eos_token_ids(path, tokenizer) -> set[int]:
    """The model's EOS ids: its generation config's and its tokenizer's (also what beam
    search ends a beam at, minivllm/beam_search.py)."""
    ids: set[int] = set()
    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    except OSError:  # no generation_config.json
        pass
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        model = config.model_config
        path = resolve_model_path(model.model, model.revision)
        self.hf_config = AutoConfig.from_pretrained(path)
        tokenizer_path = resolve_model_path(model.tokenizer) if model.tokenizer else path
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.eos_token_ids = eos_token_ids(path, self.tokenizer)
        self.max_model_len = self._max_model_len()
        self.vocab_size = self.hf_config.vocab_size
        # Grammars of structured_outputs requests compile on a worker thread; meanwhile the
        # request waits here, out of the scheduler: caller's id -> (compile, head request).
        self.structured = StructuredOutputManager(self.tokenizer, self.vocab_size,
                                                  self.eos_token_ids)
        self.runner = ModelRunner(config, path, self.hf_config, self.max_model_len,
                                  structured=self.structured)
        # LoRA adapters (--enable-lora): their deltas ride on the runner's decoder linears.
        self.lora = self._lora_manager() if config.lora_config.enable_lora else None
        self.runner.lora = self.lora
        self._compiling: dict[str, tuple[futures.Future, Request]] = {}
        # The configured scheduler, with what the model and the allocated cache decide.
        scheduler_config = dataclasses.replace(
            config.scheduler_config, num_blocks=self.runner.num_blocks,
            num_swap_blocks=self.runner.num_swap_blocks, max_model_len=self.max_model_len)
        self.scheduler = Scheduler(scheduler_config, config.policy_config.make_policy(),
                                   eos_token_ids=self.eos_token_ids,
                                   valid_drafts=self.runner.sampler.num_valid_drafts)
        self.scheduler.kv.disk = self.runner.disk  # the prefix cache's disk tier, if any
        transfer = config.cache_config.kv_transfer  # its roles (core/kv_transfer.py)
        if transfer is not None:
            connector = self.scheduler.kv.disk_connector
            connector.write_through, connector.loads = transfer.produces, transfer.consumes
            connector.write_evicted = False  # a producer's blocks are there already
        self.engine_step = EngineStep(self.scheduler)
        self.groups = CoreRequests()  # by the caller's request id, and their sequences
        self._failed: list[EngineCoreOutput] = []  # timed out: reported by the next step
        # The dashboard's request lifecycles and block map: only while someone listens.
        self.tracer: LifecycleTracer | None = None
        self._trace_interval = 0.0
        self._next_trace = 0.0
        log = config.policy_config.length_prediction_log
        self._prediction_log = open(log, "a", buffering=1) if log else None
        self._log_capacity(path)

    def _lora_manager(self) -> LoRAManager:
        """The adapters, installed on the runner's model (and told each step's rows by the
        runner)."""
        lora, runner = self.config.lora_config, self.runner
        return LoRAManager(runner.model, self.hf_config, lora.max_lora_rank, lora.max_cpu_loras,
                           runner.dtype, runner.device, bf16_weights=runner.bf16_weights)

    def _log_capacity(self, path) -> None:
        """vLLM's start-up lines: the KV cache in tokens, and how many requests of the full
        context it holds at once."""
        runner, block_size = self.runner, self.config.block_size
        tokens = runner.num_blocks * block_size
        logger.info("minivllm engine: model %s, %s", path, runner.dtype)
        logger.info("KV cache size: %s tokens (%s blocks of %d tokens, %.1f MiB, %s); swap "
                    "space: %s blocks", f"{tokens:,}", f"{runner.num_blocks:,}", block_size,
                    runner.num_blocks * runner.block_bytes / (1 << 20),
                    str(runner.kv_dtype).removeprefix("torch."), f"{runner.num_swap_blocks:,}")
        blocks_per_request = -(-self.max_model_len // block_size)
        logger.info("Maximum concurrency for %s tokens per request: %.2fx",
                    f"{self.max_model_len:,}", runner.num_blocks / blocks_per_request)

    def _max_model_len(self) -> int:
        # Sliding-window layers attend to their window, past it too (model/attention.py).
        limit = getattr(self.hf_config, "max_position_embeddings", 2048)
        if self.config.max_model_len is not None:
            if self.config.max_model_len > limit:
                raise ValueError(f"max_model_len ({self.config.max_model_len}) exceeds the "
                                 f"model's limit ({limit})")
            return self.config.max_model_len
        return limit

    # ---- requests ---------------------------------------------------------------------

    def add_request(self, req: EngineCoreRequest) -> None:
        """Queue a request; ValueError for input it cannot serve, EngineOverloadedError when
        a queue bound is reached. Either way nothing is left behind."""
        request_id, prompt, params = req.request_id, req.prompt_token_ids, req.sampling_params
        if request_id in self.groups:
            raise ValueError(f"request_id {request_id!r} is already in use")
        self._validate(prompt, params)
        if req.pooling_params is not None:
            req = self._resolve_pooling(req)
        if req.oracle_output_len is not None and self.config.length_predictor != "oracle":
            raise ValueError("oracle_output_len is a lab field, read only by a server run with "
                             "--length-predictor oracle")
        if req.pooling_params is not None:  # nothing to generate: the prompt may fill the context
            max_tokens = 0
        else:
            if params.max_tokens is None:  # the rest of the context, which must hold a token:
                # checked before it is resolved, as check_fits only sees the resolved count
                check_context_length(len(prompt), None, self.max_model_len)
            # An edge has resolved it (make_core_request); one built without one may not.
            max_tokens = resolve_max_tokens(params.max_tokens, len(prompt), self.max_model_len)
        # The context length (check_context_length), n, the KV cache and the step budget.
        self.scheduler.check_fits(len(prompt), max_tokens, num_sequences(params))
        self._check_queue_bounds(len(prompt))
        banned = self._stop_ids(params)  # until min_tokens
        if req.lora_request is not None:  # last: nothing after it may fail
            self._acquire_lora(req.lora_request)
        requests = make_sequences(req, max_tokens, banned)
        head = requests[0]
        if params.structured_outputs is not None:
            self._compiling[request_id] = (self.structured.submit(params.structured_outputs),
                                           head)
        else:
            self.scheduler.add_request(head)
        self.groups.add(request_id, requests)

    def _resolve_pooling(self, req: EngineCoreRequest) -> EngineCoreRequest:
        """A pooling request with its unset pooling fields taken from --pooler-config; its
        dimensions checked against the model's hidden size."""
        pooling = req.pooling_params.resolve(self.config.pooler_config)
        hidden_size = self.hf_config.hidden_size
        if pooling.dimensions is not None and pooling.dimensions > hidden_size:
            raise ValueError(f"dimensions must be <= the model's hidden size ({hidden_size}), "
                             f"got {pooling.dimensions}")
        if num_sequences(req.sampling_params) != 1 or req.sampling_params.structured_outputs:
            raise ValueError("a pooling request is one sequence with no structured_outputs")
        return msgspec.structs.replace(req, pooling_params=pooling)

    def _acquire_lora(self, lora: LoRARequest) -> None:
        """Load the request's adapter if need be and hold it until the request ends."""
        if self.lora is None:
            raise ValueError(f"the request asks for the LoRA adapter {lora.lora_name!r}, but "
                             "LoRA is not enabled (--enable-lora)")
        self.lora.acquire(lora)

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

    def _stop_ids(self, params: SamplingParams) -> tuple[int, ...]:
        """The tokens that end a sequence, banned by the sampler while it is below min_tokens."""
        ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            ids |= self.eos_token_ids
        return tuple(sorted(ids))

    def abort_requests(self, ids: list[str], stopped: bool = False) -> None:
        """Finish and free requests (a caller's id: all its sequences) or single sequences.
        `stopped`: a stop string ended them, which the scheduling policy learns from like any
        finish. Unknown or finished ids are ignored."""
        status = RequestStatus.FINISHED_STOPPED if stopped else RequestStatus.FINISHED_ABORTED
        for rid in ids:
            for request in self.groups.sequences(rid):
                self._finish(request, status)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        group_id, _ = self.groups.locate(request.request_id)
        if group_id in self._compiling:  # never handed to the scheduler
            request.status = status
        else:
            self.scheduler.finish_request(request, status)
        self._forget(request, status)

    def _forget(self, request: Request, status: RequestStatus) -> None:
        """The core's bookkeeping for a sequence that finished (the scheduler has freed its
        blocks): log its prediction, drop its group when the last sequence ends."""
        if self._prediction_log is not None and status is not RequestStatus.FINISHED_ABORTED:
            self._log_prediction(request, status)
        group = self.groups.of(request.request_id)
        group_id = self.groups.forget(request.request_id)
        if group_id is not None:
            self._compiling.pop(group_id, None)
            lora = group.requests[0].core_request.lora_request
            if lora is not None:
                self.lora.release(lora.lora_int_id)

    def _log_prediction(self, request: Request, status: RequestStatus) -> None:
        """One JSON line for --length-prediction-log: what the predictor said (at arrival,
        or after the prefill for predictors that read its hidden state) and the truth."""
        import json

        group = self.groups.of(request.request_id)
        started = group.first_scheduled_time if group is not None else None
        self._prediction_log.write(json.dumps({
            "queue_s": None if started is None else max(0.0, started - request.arrival_time),
            "request_id": request.request_id, "prompt_tokens": request.num_prompt_tokens,
            "max_tokens": request.max_tokens, "predicted": request.predicted_output_len,
            "output_tokens": request.num_output_tokens, "finish_reason": status.value,
            "predictor": self.config.length_predictor}) + "\n")

    def _admit_compiled(self) -> None:
        """Hand the requests whose grammar is ready to the scheduler; fail those whose grammar
        did not compile. With nothing else to run, wait a little for a compile first, rather
        than spin."""
        if not self._compiling:
            return
        if not self.scheduler.has_unfinished_requests():
            futures.wait([f for f, _ in self._compiling.values()], timeout=0.01,
                         return_when=futures.FIRST_COMPLETED)
        for request_id, (future, head) in list(self._compiling.items()):
            if not future.done():
                continue
            error = future.exception()
            if error is None:
                del self._compiling[request_id]
                self.scheduler.add_request(head)
                continue
            for request in self.groups[request_id].requests:
                self._finish(request, RequestStatus.FINISHED_ABORTED)
            self._failed.append(EngineCoreOutput(request_id, finish_reason="abort",
                                                 error_kind="invalid", error=str(error)))

    def _expire_waiting(self, now: float) -> None:
        """Fail the requests that waited, never scheduled, longer than request_timeout."""
        timeout = self.config.request_timeout
        for request in [r for r in self.scheduler.waiting if now - r.arrival_time > timeout]:
            group_id, _ = self.groups.locate(request.request_id)
            group = self.groups[group_id]
            if group.first_scheduled_time is not None:
                continue
            for r in group.requests:
                self._finish(r, RequestStatus.FINISHED_ABORTED)
            self._failed.append(EngineCoreOutput(
                group_id, finish_reason="abort", error_kind="timeout", error=(
                    f"request timed out: it waited {now - request.arrival_time:.1f}s in the "
                    f"queue, longer than request_timeout={timeout}s")))

    def _fail_shed(self, shed: list[Request]) -> None:
        """Fail the requests the policy shed for a deadline they can no longer make (edf
        with --edf-action shed), each with its whole group; this step's outputs say so."""
        for request in shed:
            group_id, _ = self.groups.locate(request.request_id)
            group = self.groups.of(request.request_id)
            if group is None:
                continue
            for r in group.requests:
                self._finish(r, RequestStatus.FINISHED_ABORTED)
            slos = own_deadlines(request)
            self._failed.append(EngineCoreOutput(
                group_id, finish_reason="abort", error_kind="deadline", error=(
                    "request shed: it could no longer meet its deadline "
                    f"({slos or 'the server defaults'}) under scheduling_policy="
                    f"{self.scheduler.policy.name}, "
                    "edf_action=shed")))

    def shutdown(self) -> None:
        """Before the engine stops: the prefix cache's blocks still in memory to the disk
        tier, if any, so that a restart finds every prefix it served (a kill -9 skips this:
        then only the evicted blocks are there); it returns once the tier's writer has
        written them all."""
        if self.runner.disk is not None:
            if self.scheduler.kv.disk_connector.write_evicted:  # (a transfer's are there)
                self.runner.disk.write(self.scheduler.kv.cached_for_disk())
            self.runner.disk.close()

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups) or bool(self._failed)

    # ---- one step ---------------------------------------------------------------------

    def step(self) -> EngineCoreOutputs:
        """Schedule, run the model, and report: each sequence's new tokens (or pooled
        vector), its logprobs and why it finished; the requests failed since the last step;
        the step's statistics and the tracer's sample."""
        if self.config.request_timeout is not None:
            self._expire_waiting(time.time())
        self._admit_compiled()
        scheduled = self.engine_step.schedule()
        sched_out = scheduled.scheduler_output
        self._fail_shed(scheduled.shed)
        started = time.time()
        if self.tracer is not None:
            self.tracer.see_arrivals(started)
        num_prompt_tokens = self._count_scheduled(sched_out, started)
        result = self.runner.execute(sched_out)
        self.scheduler.record_step_time(time.time() - started)
        outputs = self._step_outputs(scheduled, result)
        if self.scheduler.kv.disk_connector.write_through:  # a producer: the filled blocks
            self.runner.disk.write_now(self.scheduler.kv.take_disk_writes())  # out first
        failed, self._failed = self._failed, []
        ended = time.time()
        if self.tracer is not None:
            self.tracer.observe(started, ended, sched_out)
        return EngineCoreOutputs(timestamp=ended, outputs=failed + outputs,
                                 scheduler_stats=self.get_stats(),
                                 num_prompt_tokens=num_prompt_tokens,
                                 # the last step before idling: no later one would
                                 trace=self.take_trace(ended,
                                                       force=not self.has_unfinished_requests()))

    def _count_scheduled(self, sched_out: SchedulerOutput, now: float) -> int:
        """Note the step on each scheduled group (when it was first scheduled, the steps and
        step tokens of its prefill); the prompt tokens the step computes."""
        num_prompt_tokens, step_tokens = 0, sched_out.total_num_scheduled_tokens
        counted = set()
        for req_id, num_new in sched_out.num_scheduled_tokens.items():
            request = self.scheduler.requests[req_id]
            group = self.groups.of(req_id)
            if group.first_scheduled_time is None:
                group.first_scheduled_time = now
            if id(group) not in counted:  # n > 1: a step counts once
                counted.add(id(group))
                group.steps += 1
                group.step_tokens += step_tokens
            start = request.num_computed_tokens
            num_prompt_tokens += max(0, min(start + num_new, request.num_prompt_tokens) - start)
        return num_prompt_tokens

    def _step_outputs(self, scheduled: ScheduledStep, result: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """The step's outputs by sequence: prompt logprobs, then what the scheduler made of
        the sampled tokens; the sequences that finished are forgotten."""
        outputs: dict[str, EngineCoreOutput] = {}
        for req_id, (first, scored) in result.prompt_logprobs.items():
            self._output(outputs, req_id).prompt_logprobs = (
                first, [pack_logprobs(entry) for entry in scored])
        done = self.engine_step.update(scheduled, result.sampled_token_ids,
                                       result.prompt_hidden)
        for request in done.sampled:
            self._sampled_output(self._output(outputs, request.request_id), request, result)
        for request in done.finished:  # after the loop: _output reads their groups
            self._forget(request, request.status)
        return list(outputs.values())

    def _sampled_output(self, out: EngineCoreOutput, request: Request,
                        result: ModelRunnerOutput) -> None:
        """A sequence's new tokens (or its pooled vector) and logprobs, and why it finished."""
        num_new = request.num_new_tokens
        out.new_token_ids = request.output_token_ids[-num_new:]
        if len(request.output_token_ids) == num_new:  # its first: the prefill is over
            group = self.groups.of(request.request_id)
            out.prefill_steps, out.prefill_step_tokens = group.steps, group.step_tokens
        logprobs = result.logprobs.get(request.request_id)
        if logprobs is not None:
            out.new_logprobs = [pack_logprobs(entry) for entry in logprobs[:num_new]]
        out.num_cached_tokens = request.num_cached_tokens
        if request.is_pooling:  # its prompt is computed: the vector is its output
            out.pooled = result.pooled[request.request_id]
        if request.is_finished:  # the scheduler's stop rule ended it (core/stop.py)
            out.finish_reason, out.stop_reason = request.status.value, request.stop_reason

    def _output(self, outputs: dict[str, EngineCoreOutput], req_id: str) -> EngineCoreOutput:
        out = outputs.get(req_id)
        if out is None:
            group_id, index = self.groups.locate(req_id)
            out = outputs[req_id] = EngineCoreOutput(
                group_id, index,
                first_scheduled_time=self.groups[group_id].first_scheduled_time)
        return out

    # ---- tracing (the dashboard) ------------------------------------------------------

    def set_tracing(self, enabled: bool, interval: float) -> None:
        """Record request lifecycles, and sample the block map every `interval` seconds."""
        now = time.time()
        self.tracer = LifecycleTracer(self.scheduler, now) if enabled else None
        self._trace_interval, self._next_trace = interval, now

    def take_trace(self, now: float, force: bool = False) -> TraceSample | None:
        """What the tracer saw since the last sample, once per interval (or now: `force`,
        after requests came or went with no step to follow)."""
        if self.tracer is None or not (force or now >= self._next_trace):
            return None
        self._next_trace = now + self._trace_interval
        self.tracer.observe(now, now)  # requests added or aborted since the last step
        return self.tracer.take(now, with_block_map=True)

    # ---- statistics -------------------------------------------------------------------

    def get_stats(self) -> SchedulerStats:
        return self.scheduler.stats()

    # ---- operator control -------------------------------------------------------------

    def reset_prefix_cache(self, reset_external: bool = False) -> bool:
        """Forget the prefix cache (and with `reset_external`, delete the disk tier's
        files): KVCacheManager.reset_prefix_cache. Running requests keep their blocks."""
        blocks, files = self.scheduler.kv.reset_prefix_cache(reset_external)
        logger.info("prefix cache reset: %d cached blocks forgotten%s", blocks,
                    f", {files} disk tier blocks deleted" if reset_external else "")
        return True
