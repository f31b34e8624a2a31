"""ModelRunner: owns the weights and the KV-cache tensors, keeps a persistent batch that
the scheduler's per-step diffs update, performs the block copies a SchedulerOutput asks
for, runs one forward over the flattened batch and samples.

The only part of minivllm that touches tensors and devices. What it returns is plain data.

A step, in execute(): the diffs, the block copies, the drafts (speculation.py), the LoRA
adapters' rows, one forward, then what each output reads of its rows (step_rows.py) and the
sampling. The LoRA adapters (lora/, which sits above model/) are the engine core's, handed
to the runner as `lora`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from minivllm.config import EngineConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.model import kv_quant
from minivllm.model.attention import AttentionMetadata
from minivllm.model.draft_model import DraftModel
from minivllm.model.input_batch import InputBatch, StepInputs
from minivllm.model.kernels import library
from minivllm.model.kernels.threads import ThreadGovernor
from minivllm.model.kv_disk import DiskKVStore, model_fingerprint
from minivllm.model.kv_pools import KVPools
from minivllm.model.linear import repack_cache
from minivllm.model.linear.choice import (
    ChoiceTable,
    KernelChoice,
    default_table_path,
    row_padding,
)
from minivllm.model.linear.repack_cache import RepackCache
from minivllm.model.loader import load_state_dict, resolve_device
from minivllm.model.models import build_model
from minivllm.model.models.layers import GatedMLP
from minivllm.model.pooler import Pooler
from minivllm.model.precision import resolve_precision
from minivllm.model.sampler import Sampler
from minivllm.model.spec_verify import Verified, sample_with_drafts
from minivllm.model.speculation import Speculation, draft_model_config
from minivllm.model.step_rows import StepRows
from minivllm.outputs import Logprob
from minivllm.structured_output.manager import StructuredOutputManager

GiB = 1 << 30


@dataclass
class ModelRunnerOutput:
    # request id -> its new tokens: one, or with draft tokens the accepted drafts and the
    # target's next token (model/spec_verify.py)
    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # request id -> one dict per new token, for requests that asked for logprobs
    logprobs: dict[str, list[dict[int, Logprob]]] = field(default_factory=dict)
    # request id -> (index of the first prompt token scored, one dict per scored token)
    prompt_logprobs: dict[str, tuple[int, list[dict[int, Logprob]]]] = field(default_factory=dict)
    # request id -> the final-norm hidden state of its last prompt token (float32 numpy row),
    # for requests whose prefill completed this step, when the scheduler asked
    # (SchedulerOutput.want_prompt_hidden: the `probe` length predictor). No extra forward.
    prompt_hidden: dict[str, np.ndarray] = field(default_factory=dict)
    # request id -> its pooled vector, for pooling requests whose prompt completed this step
    pooled: dict[str, list[float]] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, config: EngineConfig, model_path, hf_config, max_model_len: int,
                 structured: StructuredOutputManager | None = None) -> None:
        """`structured`: compiles the grammars of structured_outputs requests (the engine
        core's); None serves none."""
        self.threads = _thread_governor(config.parallel_config.num_threads)
        model_config, cache_config = config.model_config, config.cache_config
        self.device = resolve_device(model_config.device)
        precision = resolve_precision(model_config, hf_config, self.device)
        self.dtype, self.bf16_weights = precision.activations, precision.bf16_weights
        # A quantized cache (kv_quant.py) stores kv_format.storage bytes and fp32 scales;
        # an int8 one its keys smoothed (key_smoothing.py).
        self.kv_format = kv_quant.FORMATS.get(cache_config.kv_cache_dtype)
        self.kernel_choice = _kernel_choice(config, self.device)
        self.model = self._load_model(model_path, hf_config, model_config.quantization)
        # oneDNN linears run at a few row counts (linear/onednn.py): where one runs, pad the batch
        # to one once per step, so that no layer pads (and copies) its input again.
        self.row_padding = row_padding(_decoder_linears(self.model))
        self.block_size = config.scheduler_config.block_size
        self.kv_dtype = (self.kv_format.dtype if self.kv_format
                         else precision.dtype if cache_config.kv_cache_dtype == "auto"
                         else torch.bfloat16)
        # draft_model speculation: the draft model's KV cache has the target's blocks.
        spec = config.scheduler_config.speculative_config
        draft_path, draft_config = draft_model_config(spec, hf_config)
        target_kv, *draft_kv = self._allocate_kv_caches(
            config, [c for c in (hf_config, draft_config) if c is not None], max_model_len)
        self.k_cache, self.v_cache, self.k_host, self.v_host = target_kv
        self.drafter = None
        if draft_config is not None:
            [(k, v, k_host, v_host)] = draft_kv
            self.drafter = DraftModel(
                self._load_model(draft_path, draft_config, model_config.quantization),
                (k, v), (k_host, v_host))
        self.speculation = Speculation(self.drafter)
        # The prefix cache's disk tier (--kv-offloading-backend disk), else None.
        self.disk = self._disk_tier(cache_config, model_path, hf_config,
                                    spec["model"] if draft_config is not None else None,
                                    model_config.quantization)
        # LoRA adapters (--enable-lora): the engine core's LoRAManager, built over
        # self.model once it is loaded (lora/ sits above model/); it is told each step's
        # rows per adapter (set_step).
        self.lora = None
        self.use_kernels = library.available(self.device, self.dtype)  # builds them once
        self.sampler = Sampler(hf_config.vocab_size, self.device, model_config.seed,
                               use_kernel=library.available(self.device, torch.float32),
                               structured=structured)
        self.pooler = Pooler()  # pooling requests (embeddings) are pooled, not sampled
        max_len = getattr(hf_config, "max_position_embeddings", 2048)
        self.batch = InputBatch(-(-max_len // self.block_size) + 1, self.block_size)
        # The per-request attention oracle instead of the batched fast path (tests).
        self.use_reference_attention = False

    def _load_model(self, path, hf_config, quantization: str | None) -> torch.nn.Module:
        with repack_cache.using(self._repack_cache(path, quantization)):
            weights = {k: v.to(self.device, self.dtype)
                       for k, v in load_state_dict(
                           path, keep_gguf_blocks=quantization == "gguf").items()}
            return build_model(hf_config, weights, quantization,
                               linear_weights="bf16" if self.bf16_weights else None,
                               smooth_keys=bool(self.kv_format and self.kv_format.smooth_keys),
                               kernel_choice=self.kernel_choice).to(self.device)

    def _repack_cache(self, path, quantization: str | None) -> RepackCache | None:
        """A GGUF file's blocks repacked on this CPU are kept beside its model directory."""
        if quantization != "gguf" or self.device.type != "cpu" or not library.gguf_repacked():
            return None
        return RepackCache(Path(path) / RepackCache.file_name())

    def _allocate_kv_caches(self, config: EngineConfig, hf_configs: list,
                            max_model_len: int) -> list[tuple]:
        """Size the KV cache in blocks, each block holding every model's K and V (the
        target's, and the draft model's if any), and allocate each model's pools: (K, V,
        host K, host V) by model."""
        pools = KVPools(self.block_size, self.kv_dtype, self.kv_format, self.device)
        shapes = [pools.block_shape(c) for c in hf_configs]
        self.block_bytes = block_bytes = sum(2 * pools.block_bytes(shape) for shape in shapes)
        self.num_blocks = config.kv_cache_num_blocks(block_bytes, max_model_len)
        self.num_swap_blocks = int(config.cache_config.swap_space * GiB // block_bytes)
        # One block more than the scheduler hands out: padding rows write their K/V there.
        self.padding_slot = self.num_blocks * self.block_size
        return [pools.allocate(shape, self.num_blocks, self.num_swap_blocks)
                for shape in shapes]

    def _disk_tier(self, cache_config, model_path, hf_config, draft: str | None,
                   quantization: str | None) -> DiskKVStore | None:
        """The prefix cache's disk tier, its blocks valid for this model, its draft model and
        the cache's layout only."""
        transfer = cache_config.kv_transfer
        if cache_config.kv_offloading_backend != "disk" and transfer is None:
            return None
        identity = {"model": str(model_path),
                    "fingerprint": model_fingerprint(model_path, hf_config),
                    "draft": draft, "dtype": str(self.dtype),
                    "kv_cache_dtype": cache_config.kv_cache_dtype,
                    "quantization": quantization, "block_size": self.block_size}
        # --kv-transfer-config: the folder the instances share, where other processes'
        # files appear while this one runs
        return DiskKVStore(transfer.path if transfer else cache_config.kv_offloading_path,
                           int(cache_config.kv_offloading_size * GiB), identity,
                           kv_quant.tensors(self._device_caches()), shared=transfer is not None)

    # ---- block copies -----------------------------------------------------------------

    def _copy(self, mapping: list[tuple[int, int]], src: tuple, dst: tuple) -> None:
        if not mapping:
            return
        src, dst = kv_quant.tensors(src), kv_quant.tensors(dst)  # scales with their blocks
        src_ids = torch.tensor([s for s, _ in mapping], device=src[0].device)
        dst_ids = torch.tensor([d for _, d in mapping], device=dst[0].device)
        for s, d in zip(src, dst):
            d[:, dst_ids] = s[:, src_ids].to(d.device)

    def _device_caches(self) -> tuple:
        """K and V of the model, and of the draft model if any."""
        device = (self.k_cache, self.v_cache)
        return device + self.drafter.caches if self.drafter is not None else device

    def copy_blocks(self, out: SchedulerOutput) -> None:
        """The disk tier's writes, swap-outs (their blocks may be handed out again this
        step), the disk tier's loads, the copy-on-write copies, then swap-ins — the order
        core/kv_cache.py relies on — all before the forward reads the cache."""
        device, host = self._device_caches(), (self.k_host, self.v_host)
        if self.drafter is not None:
            host = host + self.drafter.host_caches
        if self.disk is not None:
            self.disk.write(out.disk_writes)
        self._copy(out.swap_out, device, host)
        if self.disk is not None:
            self.disk.load(out.disk_loads)
        self._copy(out.copies, device, device)
        self._copy(out.swap_in, host, device)

    # ---- one step ---------------------------------------------------------------------

    def _forward(self, inputs: StepInputs, model: torch.nn.Module | None = None,
                 caches: tuple | None = None) -> torch.Tensor:
        """The model (or the draft model, with its caches) over the step's tokens, padded to
        a row bucket when the linears want one (padding rows: token 0 at position 0,
        writing K/V into the padding block)."""
        tokens, positions, slots = inputs.token_ids, inputs.positions, inputs.slot_mapping
        num_tokens = len(tokens)
        pad = self.row_padding.rows(num_tokens) - num_tokens
        if pad:
            tokens, positions = np.pad(tokens, (0, pad)), np.pad(positions, (0, pad))
            slots = np.pad(slots, (0, pad), constant_values=self.padding_slot)
        as_tensor = lambda x: torch.from_numpy(x).to(self.device)  # noqa: E731
        meta = AttentionMetadata(
            slot_mapping=as_tensor(slots), block_table=as_tensor(inputs.block_table),
            seq_lens=as_tensor(inputs.seq_lens), query_start_loc=as_tensor(inputs.query_start_loc),
            num_decodes=inputs.num_decodes, num_verifies=inputs.num_verifies,
            num_tokens=num_tokens, block_size=self.block_size,
            use_reference=self.use_reference_attention, use_kernel=self.use_kernels)
        model = model or self.model
        return model(as_tensor(tokens), as_tensor(positions),
                     caches or (self.k_cache, self.v_cache), meta)

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Apply the step's diffs, copies, one forward, sampling for the requests whose
        last token is computed this step, prompt logprobs for those that asked, and the
        pooled vectors of pooling requests whose prompt completed."""
        if self.threads is not None:
            self.threads.update()
        self._apply_diffs(out)
        self.copy_blocks(out)
        drafts = self.speculation.drafts(out, self.batch, self._forward, self.sampler)
        result = ModelRunnerOutput()
        if not out.num_scheduled_tokens:
            return result
        inputs = self.batch.prepare(out.num_scheduled_tokens, verifying=drafts)
        self._set_lora_step(inputs)
        hidden = self._forward(inputs)
        rows = StepRows.plan(out, inputs, self.batch, self.pooler, drafts)
        result.pooled = rows.pool(self.pooler, hidden)
        result.prompt_hidden = rows.prompt_hidden(hidden)
        if not rows.logit_rows:
            return result
        logits = self.model.compute_logits(rows.for_logits(hidden))
        result.prompt_logprobs = rows.prompt_logprobs(logits)
        self._keep_sampled(self._sample(logits, rows.sampling, drafts), drafts, result)
        return result

    def _apply_diffs(self, out: SchedulerOutput) -> None:
        """Forget the finished requests; add the new ones to the sampler or the pooler."""
        for req_id in out.finished_req_ids:
            self.sampler.remove_request(req_id)
            self.pooler.remove(req_id)
            self.speculation.remove(req_id)
        new_requests = self.batch.apply(out)
        # The draft model's K/V is valid no further than the target's: a request preempted
        # to recompute comes back with fewer tokens computed (and other blocks past its
        # cached prefix); a new one has none of it.
        cached = out.scheduled_cached_reqs
        for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens):
            self.speculation.verified(req_id, computed)
        for new in new_requests:
            self.speculation.remove(new.req_id)
            if new.pooling_params is not None:
                self.pooler.add_request(new.req_id, new.pooling_params)
                continue
            self.sampler.add_request(new.req_id, new.sampling_params, new.prompt_token_ids,
                                     new.output_token_ids, new.banned_until_min_tokens,
                                     new.seed)

    def _set_lora_step(self, inputs: StepInputs) -> None:
        """Tell the adapters which rows of the step run which of them."""
        if self.lora is not None:
            self.lora.set_step([self.batch.requests[r].lora_int_id for r in inputs.req_ids],
                               inputs.query_start_loc)

    def _sample(self, logits: torch.Tensor, sampling: list[tuple[str, int, list[int]]],
                drafts: dict[str, list[int]]) -> dict[str, Verified]:
        """The new tokens of the requests that sample: with draft tokens, the drafts the
        target accepted and its next token (model/spec_verify.py); else one each."""
        if drafts:
            return sample_with_drafts(self.sampler, logits, sampling,
                                      self.speculation.proposals)
        if not sampling:
            return {}
        if len(sampling) < logits.shape[0]:  # else every row, in order: no copy
            logits = logits[torch.tensor([at for _, at, _ in sampling])]
        ids = [req_id for req_id, _, _ in sampling]
        sampled = self.sampler.sample(logits.contiguous(), ids)
        return {req_id: Verified([token_id], [logprobs])
                for req_id, token_id, logprobs in zip(ids, sampled.token_ids, sampled.logprobs)}

    def _keep_sampled(self, sampled: dict[str, Verified], drafts: dict[str, list[int]],
                      result: ModelRunnerOutput) -> None:
        """Append the new tokens to their requests and report them."""
        for req_id, new in sampled.items():
            state = self.batch.requests[req_id]
            if req_id in drafts:  # its last token and the accepted drafts were computed
                self.speculation.verified(req_id, state.num_computed_tokens + len(new.token_ids))
            for token_id in new.token_ids:
                state.append(token_id)
            result.sampled_token_ids[req_id] = new.token_ids
            if new.logprobs[0] is not None:
                result.logprobs[req_id] = new.logprobs


def _decoder_linears(model: torch.nn.Module) -> list:
    """The linears every row of a step runs through (an MoE block's experts see subsets)."""
    linears = []
    for layer in model.layers:
        linears += [layer.self_attn.qkv, layer.o_proj]
        if isinstance(layer.mlp, GatedMLP):
            linears += [layer.mlp.gate_up, layer.mlp.down]
    return linears


def _thread_governor(num_threads: int | None) -> ThreadGovernor | None:
    """A fixed thread count (--num-threads) is set; without one, the runner follows the cores
    other processes leave free."""
    if num_threads:
        torch.set_num_threads(num_threads)
        return None
    return ThreadGovernor(torch.get_num_threads()) if torch.get_num_threads() > 1 else None


def _kernel_choice(config: EngineConfig, device: torch.device) -> KernelChoice | None:
    """--kernel-choice measure on the CPU: the linears' ways timed for the rows a step can
    bring (the LM head's: the sampled rows, speculation's drafts among them)."""
    if config.model_config.kernel_choice != "measure" or device.type != "cpu":
        return None
    scheduler = config.scheduler_config
    spec = scheduler.speculative_config
    drafts = spec["num_speculative_tokens"] if spec else 0
    return KernelChoice(scheduler.max_num_batched_tokens, scheduler.max_num_seqs * (1 + drafts),
                        ChoiceTable(default_table_path()))
