"""ModelRunner: owns the weights and the KV-cache tensors, keeps a persistent batch that
the scheduler's per-step diffs update, performs the block copies a SchedulerOutput asks
for, runs one forward over the flattened batch and samples.

The only part of minivllm that touches tensors and devices. What it returns is plain data.
"""

from __future__ import annotations

import logging
import mmap
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import AutoConfig

from minivllm.config import EngineConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.lora.manager import LoRAManager
from minivllm.model import kernels, kv_quant
from minivllm.model.attention import AttentionMetadata
from minivllm.model.draft_model import DraftModel
from minivllm.model.input_batch import InputBatch, StepInputs
from minivllm.model.kernels import cpu
from minivllm.model.kernels.isa import native_bf16
from minivllm.model.kernels.linear_choice import (
    ChoiceTable,
    KernelChoice,
    default_table_path,
    row_padding,
)
from minivllm.model.kernels.threads import ThreadGovernor
from minivllm.model.kv_disk import DiskKVStore, model_fingerprint
from minivllm.model.loader import (
    load_state_dict,
    resolve_device,
    resolve_dtype,
    resolve_model_path,
)
from minivllm.model.models import build_model, head_dim
from minivllm.model.models.layers import GatedMLP
from minivllm.model.pooler import Pooler
from minivllm.model.sampler import Sampler, top_logprobs
from minivllm.model.spec_verify import sample_with_drafts
from minivllm.outputs import Logprob
from minivllm.structured_output.manager import StructuredOutputManager

logger = logging.getLogger(__name__)

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
        num_threads = config.parallel_config.num_threads
        if num_threads:
            torch.set_num_threads(num_threads)
        # Without a fixed thread count, follow the cores other processes leave free.
        self.threads = (ThreadGovernor(torch.get_num_threads())
                        if not num_threads and torch.get_num_threads() > 1 else None)
        model_config = config.model_config
        self.device = resolve_device(model_config.device)
        # int8 quantizes the linears and keeps everything else in float32 (linear_int8.py);
        # gguf keeps a GGUF file's linear weights and embeddings as stored (linear_gguf.py),
        # with float32 activations unless dtype names bfloat16 (then the CPU's bf16 below).
        # bf16 on the CPU is bf16 linear weights and KV cache, with fp32 activations between
        # the ops, so that the C kernels (fp32) keep running (kernels/linear.py).
        quantization = model_config.quantization
        dtype = (torch.float32 if quantization in ("int8", "gguf") and model_config.dtype == "auto"
                 else resolve_dtype(model_config.dtype, hf_config, self.device))
        cpu_bf16 = self.device.type == "cpu" and dtype == torch.bfloat16
        if quantization == "gguf" and dtype != torch.float32 and not cpu_bf16:
            # The blocks' products, the embeddings' rows and the tied head are fp32.
            raise ValueError(f"dtype={model_config.dtype!r} on {self.device.type} with "
                             "quantization='gguf' (a GGUF file's default): the blocks run "
                             "with float32 activations there (--dtype float32); --quantization "
                             f"none --dtype {model_config.dtype} dequantizes every weight "
                             "instead")
        self.dtype = torch.float32 if cpu_bf16 else dtype
        if cpu_bf16:
            logger.info("bfloat16 on the CPU: bf16 linear weights (%s), fp32 activations, "
                        "bf16 KV cache", _bf16_linears())
        if quantization == "gguf":
            logger.info("quantization=gguf: the GGUF file's blocks run as stored, float32 "
                        "activations (--quantization none dequantizes every weight to "
                        "--dtype instead)")
        cache_config = config.cache_config
        # A quantized cache (kv_quant.py) stores kv_format.storage bytes and fp32 scales;
        # an int8 one its keys smoothed (key_smoothing.py).
        self.kv_format = kv_quant.FORMATS.get(cache_config.kv_cache_dtype)
        self.kernel_choice = _kernel_choice(config, self.device)
        self.model = self._load_model(model_path, hf_config, quantization, cpu_bf16)
        # oneDNN linears run at a few row counts (linear.py): where one runs, pad the batch
        # to one once per step, so that no layer pads (and copies) its input again.
        self.row_padding = row_padding(_decoder_linears(self.model))
        self.block_size = config.scheduler_config.block_size
        self.kv_dtype = (self.kv_format.dtype if self.kv_format
                         else dtype if cache_config.kv_cache_dtype == "auto" else torch.bfloat16)
        # draft_model speculation: the draft model's KV cache has the target's blocks.
        spec = config.scheduler_config.speculative_config
        draft_path, draft_config = None, None
        if spec and spec["method"] == "draft_model":
            draft_path = resolve_model_path(spec["model"])
            draft_config = AutoConfig.from_pretrained(draft_path)
            if draft_config.vocab_size != hf_config.vocab_size:
                raise ValueError(f"speculative_config: the draft model {spec['model']!r} has a "
                                 f"vocabulary of {draft_config.vocab_size} tokens, the target "
                                 f"{hf_config.vocab_size}: they must share the tokenizer")
        shapes = [self._block_shape(c) for c in (hf_config, draft_config) if c is not None]
        self.block_bytes = block_bytes = sum(2 * self._kv_bytes(shape) for shape in shapes)
        self.num_blocks = config.kv_cache_num_blocks(block_bytes, max_model_len)
        self.num_swap_blocks = int(cache_config.swap_space * GiB // block_bytes)
        # One block more than the scheduler hands out: padding rows write their K/V there.
        self.padding_slot = self.num_blocks * self.block_size
        self.k_cache, self.v_cache, self.k_host, self.v_host = self._kv_pools(shapes[0])
        self.drafter = None
        if draft_config is not None:
            k, v, k_host, v_host = self._kv_pools(shapes[1])
            self.drafter = DraftModel(
                self._load_model(draft_path, draft_config, model_config.quantization, cpu_bf16),
                (k, v), (k_host, v_host))
        self.disk = None  # the prefix cache's disk tier (--kv-offloading-backend disk)
        if cache_config.kv_offloading_backend == "disk":
            identity = {"model": str(model_path),
                        "fingerprint": model_fingerprint(model_path, hf_config),
                        "draft": spec["model"] if draft_config is not None else None,
                        "dtype": str(self.dtype), "kv_cache_dtype": cache_config.kv_cache_dtype,
                        "quantization": quantization, "block_size": self.block_size}
            self.disk = DiskKVStore(cache_config.kv_offloading_path,
                                    int(cache_config.kv_offloading_size * GiB), identity,
                                    kv_quant.tensors(self._device_caches()))
        # LoRA adapters (--enable-lora): their deltas ride on the decoder's linears.
        lora = config.lora_config
        self.lora = LoRAManager(self.model, hf_config, lora.max_lora_rank, lora.max_cpu_loras,
                                self.dtype, self.device, bf16_weights=cpu_bf16) \
            if lora.enable_lora else None
        self.use_kernels = cpu.available(self.device, self.dtype)  # builds them once
        self.sampler = Sampler(hf_config.vocab_size, self.device, model_config.seed,
                               use_kernel=cpu.available(self.device, torch.float32),
                               structured=structured)
        self.pooler = Pooler()  # pooling requests (embeddings) are pooled, not sampled
        max_len = getattr(hf_config, "max_position_embeddings", 2048)
        self.batch = InputBatch(-(-max_len // self.block_size) + 1, self.block_size)
        # The per-request attention oracle instead of the batched fast path (tests).
        self.use_reference_attention = False

    def _load_model(self, path, hf_config, quantization: str | None,
                    cpu_bf16: bool) -> torch.nn.Module:
        weights = {k: v.to(self.device, self.dtype)
                   for k, v in load_state_dict(
                       path, keep_gguf_blocks=quantization == "gguf").items()}
        return build_model(hf_config, weights, quantization,
                           linear_weights="bf16" if cpu_bf16 else None,
                           smooth_keys=bool(self.kv_format and self.kv_format.smooth_keys),
                           kernel_choice=self.kernel_choice).to(self.device)

    def _block_shape(self, hf_config) -> tuple[int, ...]:
        """One KV block of one of K and V: [layers, block_size, kv_heads, head_dim]."""
        return (hf_config.num_hidden_layers, self.block_size, hf_config.num_key_value_heads,
                head_dim(hf_config))

    def _kv_bytes(self, block_shape: tuple[int, ...]) -> int:
        """The bytes of one block of one of K and V: its values, and a quantized cache's
        scales (fp32, one per token and KV head)."""
        values = torch.Size(block_shape).numel()
        if self.kv_format is None:
            return values * self.kv_dtype.itemsize
        return values * self.kv_format.storage.itemsize + values // block_shape[-1] * 4

    def _kv_pools(self, block_shape: tuple[int, ...]) -> tuple:
        """K and V caches (with the padding block), and the host swap pool's K and V, which
        is filled lazily: only swapped-out blocks are ever read. Tensors, or QuantizedKV."""
        layers, *block = block_shape
        shape = (layers, self.num_blocks + 1, *block)
        host_shape = (layers, self.num_swap_blocks, *block)
        pin = self.device.type == "cuda"
        fmt = self.kv_format
        host = lambda shape, dtype: torch.empty(shape, dtype=dtype, pin_memory=pin)  # noqa: E731
        if fmt is None:
            return (self._zeros(shape, self.kv_dtype), self._zeros(shape, self.kv_dtype),
                    host(host_shape, self.kv_dtype), host(host_shape, self.kv_dtype))
        device = lambda: kv_quant.QuantizedKV(self._zeros(shape, fmt.storage),  # noqa: E731
                                     self._zeros(shape[:-1], torch.float32), fmt)
        swapped = lambda: kv_quant.QuantizedKV(host(host_shape, fmt.storage),  # noqa: E731
                                      host(host_shape[:-1], torch.float32), fmt)
        return device(), device(), swapped(), swapped()

    def _zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Zeroed, as the padded decode path masks unused slots and masked garbage must not
        be NaN. On the CPU an anonymous mapping: the OS hands out zero pages as they are
        first touched, where torch.zeros would write every byte of a multi-GiB cache before
        the engine can start (numpy.zeros would too, and asks for huge pages, which here
        made every first touch stall on memory compaction)."""
        if self.device.type != "cpu":
            return torch.zeros(shape, dtype=dtype, device=self.device)
        pages = mmap.mmap(-1, torch.Size(shape).numel() * dtype.itemsize)
        return torch.frombuffer(pages, dtype=dtype).view(shape)

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
        for req_id in out.finished_req_ids:
            self.sampler.remove_request(req_id)
            self.pooler.remove(req_id)
            if self.drafter is not None:
                self.drafter.remove(req_id)
        for new in self.batch.apply(out):
            if new.pooling_params is not None:
                self.pooler.add_request(new.req_id, new.pooling_params)
                continue
            self.sampler.add_request(new.req_id, new.sampling_params, new.prompt_token_ids,
                                     new.output_token_ids, new.banned_until_min_tokens,
                                     new.seed)
        self.copy_blocks(out)
        drafts = out.scheduled_spec_decode_tokens
        if self.drafter is not None and out.num_scheduled_tokens:
            drafts = self.drafter.propose(out, self.batch, self._forward)
        for req_id, tokens in drafts.items():
            self.batch.requests[req_id].put_drafts(tokens)
        result = ModelRunnerOutput()
        if not out.num_scheduled_tokens:
            return result
        inputs = self.batch.prepare(out.num_scheduled_tokens, verifying=drafts)
        if self.lora is not None:
            self.lora.set_step([self.batch.requests[r].lora_int_id for r in inputs.req_ids],
                               inputs.query_start_loc)
        hidden = self._forward(inputs)
        # Rows of `hidden` whose logits are needed: the last token of each sampling request
        # (and its draft tokens), and every prompt position of requests that score their
        # prompt.
        wanted, sampling, prompt_spans, last_prompt_rows = [], [], [], {}
        ends = inputs.query_start_loc[1:].tolist()
        for i, req_id in enumerate(inputs.req_ids):
            state = self.batch.requests[req_id]
            end, start = ends[i], state.num_computed_tokens
            n = out.num_scheduled_tokens[req_id]
            if req_id in self.pooler:  # its rows are pooled; it has nothing to sample
                pooled = self.pooler.add_chunk(req_id, hidden[end - n:end], start,
                                               state.num_prompt_tokens)
                if pooled is not None:
                    result.pooled[req_id] = pooled
                continue
            last_prompt = state.num_prompt_tokens - 1
            if out.want_prompt_hidden and start <= last_prompt < start + n:
                last_prompt_rows[req_id] = end - n + last_prompt - start
            if state.params.prompt_logprobs is not None:
                num_scored = max(0, min(start + n, state.num_prompt_tokens - 1) - start)
                if num_scored:
                    targets = state.token_ids[start + 1:start + 1 + num_scored].tolist()
                    prompt_spans.append((req_id, start + 1, len(wanted), targets,
                                         state.params.prompt_logprobs))
                    wanted.extend(range(end - n, end - n + num_scored))
            k = len(drafts.get(req_id, ()))
            if start + n == state.num_tokens + k:
                sampling.append((req_id, len(wanted), drafts.get(req_id, [])))
                wanted.extend(range(end - 1 - k, end))
        if last_prompt_rows:
            rows = hidden[torch.tensor(list(last_prompt_rows.values()), device=self.device)]
            result.prompt_hidden = dict(zip(last_prompt_rows, rows.float().cpu().numpy()))
        if not wanted:
            return result
        if wanted == list(range(len(wanted))):  # the first rows, in order (all decodes)
            hidden = hidden[:len(wanted)]
        else:
            hidden = hidden[torch.tensor(wanted, device=self.device)]
        logits = self.model.compute_logits(hidden)
        for req_id, first, at, targets, num in prompt_spans:
            logprobs = torch.log_softmax(logits[at:at + len(targets)], dim=-1)
            result.prompt_logprobs[req_id] = (first, [
                top_logprobs(logprobs[j], token, num) for j, token in enumerate(targets)])
        if drafts:
            self._sample_with_drafts(logits, sampling, result)
        elif sampling:
            sampled_logits = logits
            if len(sampling) < logits.shape[0]:  # else every row, in order: no copy
                sampled_logits = logits[torch.tensor([at for _, at, _ in sampling])]
            ids = [req_id for req_id, _, _ in sampling]
            sampled = self.sampler.sample(sampled_logits.contiguous(), ids)
            for req_id, token_id, logprobs in zip(ids, sampled.token_ids, sampled.logprobs):
                self.batch.requests[req_id].append(token_id)
                result.sampled_token_ids[req_id] = [token_id]
                if logprobs is not None:
                    result.logprobs[req_id] = [logprobs]
        return result

    def _sample_with_drafts(self, logits: torch.Tensor, sampling: list, result) -> None:
        """A step with draft tokens: verify them (model/spec_verify.py) and keep what the
        target model accepted."""
        for req_id, verified in sample_with_drafts(self.sampler, logits, sampling).items():
            state = self.batch.requests[req_id]
            for token_id in verified.token_ids:
                state.append(token_id)
            result.sampled_token_ids[req_id] = verified.token_ids
            if verified.logprobs[0] is not None:
                result.logprobs[req_id] = verified.logprobs


def _decoder_linears(model: torch.nn.Module) -> list:
    """The linears every row of a step runs through (an MoE block's experts see subsets)."""
    linears = []
    for layer in model.layers:
        linears += [layer.self_attn.qkv, layer.o_proj]
        if isinstance(layer.mlp, GatedMLP):
            linears += [layer.mlp.gate_up, layer.mlp.down]
    return linears


def _bf16_linears() -> str:
    """How the CPU's bf16 linears run, for the start-up line."""
    if kernels.enabled() and cpu.amx():
        return "AMX-BF16 tiles, the LM head too, fp32 logits"
    if kernels.enabled() and cpu.panel_bf16_dot():
        return ("native bf16 dot products, oneDNN's or panel_gemm.c's, the LM head on the "
                "latter, fp32 logits")
    if torch.ops.mkldnn._is_mkldnn_bf16_supported() and native_bf16():
        return "oneDNN, native bf16 dot products; the LM head fp32"
    if kernels.enabled() and cpu.panel_width():
        return ("stored in bf16, fp32 arithmetic (no AVX512-BF16: half fp32's bytes per "
                "token, no rounding but the weights'), the LM head too")
    return "emulated: this CPU has no AVX512-BF16 and no AVX2 kernels; float32 is faster here"


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
