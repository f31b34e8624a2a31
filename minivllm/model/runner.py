"""ModelRunner: owns the weights and the KV-cache tensors, performs the block copies a
SchedulerOutput asks for, runs one forward over the flattened batch and samples.

The only part of minivllm that touches tensors and devices.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field

import torch

from minivllm.config import EngineConfig
from minivllm.core.scheduler import SchedulerOutput
from minivllm.model.attention import AttentionMetadata
from minivllm.model.kernels import cpu
from minivllm.model.kernels.threads import ThreadGovernor
from minivllm.model.loader import load_state_dict, resolve_device, resolve_dtype
from minivllm.model.models import build_model, head_dim
from minivllm.model.sampler import SampleResult, SamplingRow, sample, top_logprobs
from minivllm.outputs import Logprob

GiB = 1 << 30


@dataclass
class StepResult:
    sampled: dict[str, SampleResult] = field(default_factory=dict)
    # request id -> (index of the first prompt token scored, one dict per scored token)
    prompt_logprobs: dict[str, tuple[int, list[dict[int, Logprob]]]] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, config: EngineConfig, model_path, hf_config) -> None:
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        # Without a fixed thread count, follow the cores other processes leave free.
        self.threads = (ThreadGovernor(torch.get_num_threads())
                        if not config.num_threads and torch.get_num_threads() > 1 else None)
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, hf_config)
        weights = {k: v.to(self.device, self.dtype)
                   for k, v in load_state_dict(model_path).items()}
        self.model = build_model(hf_config, weights).to(self.device)
        self.block_size = config.block_size
        layers, kv_heads = hf_config.num_hidden_layers, hf_config.num_key_value_heads
        shape = (layers, self.block_size, kv_heads, head_dim(hf_config))
        block_bytes = 2 * torch.Size(shape).numel() * self.dtype.itemsize
        self.num_blocks = config.num_kv_blocks or max(1, int(config.kv_cache_space * GiB // block_bytes))
        self.num_swap_blocks = int(config.swap_space * GiB // block_bytes)
        cache_shape = (layers, self.num_blocks, *shape[1:])
        self.k_cache = self._zeros(cache_shape)
        self.v_cache = self._zeros(cache_shape)
        # The host swap pool is filled lazily: only swapped-out blocks are ever read.
        host_shape = (layers, self.num_swap_blocks, *shape[1:])
        pin = self.device.type == "cuda"
        self.k_host = torch.empty(host_shape, dtype=self.dtype, pin_memory=pin)
        self.v_host = torch.empty(host_shape, dtype=self.dtype, pin_memory=pin)
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.use_kernels = cpu.available(self.device, self.dtype)  # builds them once
        # The per-request attention oracle instead of the batched fast path (tests).
        self.use_reference_attention = False

    def _zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        """Zeroed, as the padded decode path masks unused slots and masked garbage must not
        be NaN. On the CPU an anonymous mapping: the OS hands out zero pages as they are
        first touched, where torch.zeros would write every byte of a multi-GiB cache before
        the engine can start (numpy.zeros would too, and asks for huge pages, which here
        made every first touch stall on memory compaction)."""
        if self.device.type != "cpu":
            return torch.zeros(shape, dtype=self.dtype, device=self.device)
        pages = mmap.mmap(-1, torch.Size(shape).numel() * self.dtype.itemsize)
        return torch.frombuffer(pages, dtype=self.dtype).view(shape)

    def make_generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(seed)

    # ---- block copies -----------------------------------------------------------------

    def _copy(self, mapping: list[tuple[int, int]], src: tuple, dst: tuple) -> None:
        if not mapping:
            return
        src_ids = torch.tensor([s for s, _ in mapping], device=src[0].device)
        dst_ids = torch.tensor([d for _, d in mapping], device=dst[0].device)
        for s, d in zip(src, dst):
            d[:, dst_ids] = s[:, src_ids].to(d.device)

    def copy_blocks(self, out: SchedulerOutput) -> None:
        """Swap-out first (its blocks may be reused this step), then swap-in, then
        copy-on-write copies — all before the forward reads the cache."""
        self._copy(out.swap_out, (self.k_cache, self.v_cache), (self.k_host, self.v_host))
        self._copy(out.swap_in, (self.k_host, self.v_host), (self.k_cache, self.v_cache))
        self._copy(out.copies, (self.k_cache, self.v_cache), (self.k_cache, self.v_cache))

    # ---- one step ---------------------------------------------------------------------

    def _prepare(self, out: SchedulerOutput):
        tokens, positions, slots = [], [], []
        query_lens, seq_lens, tables = [], [], []
        for s in out.scheduled:
            r, start, n = s.request, s.request.num_computed_tokens, s.num_new_tokens
            tokens.extend(r.all_token_ids[start:start + n])
            pos = range(start, start + n)
            positions.extend(pos)
            slots.extend(r.block_ids[p // self.block_size] * self.block_size
                         + p % self.block_size for p in pos)
            query_lens.append(n)
            seq_lens.append(start + n)
            tables.append(r.block_ids)
        as_tensor = lambda x: torch.tensor(x, dtype=torch.long, device=self.device)  # noqa: E731
        meta = AttentionMetadata(
            slot_mapping=as_tensor(slots), query_lens=query_lens, seq_lens=seq_lens,
            block_tables=[as_tensor(t) for t in tables], block_size=self.block_size,
            use_kernel=self.use_kernels)
        if self.use_reference_attention:
            meta.use_reference = True
            return as_tensor(tokens), as_tensor(positions), meta
        decodes = [i for i, n in enumerate(query_lens) if n == 1]
        meta.prefill_indices = [i for i, n in enumerate(query_lens) if n > 1]
        meta.all_decode = not meta.prefill_indices
        if decodes:
            width = max(len(tables[i]) for i in decodes)
            meta.decode_block_table = as_tensor(
                [tables[i] + [0] * (width - len(tables[i])) for i in decodes])
            meta.decode_seq_lens = as_tensor([seq_lens[i] for i in decodes])
            starts = [sum(query_lens[:i]) for i in decodes] if not meta.all_decode else decodes
            meta.decode_token_index = as_tensor(starts)
        return as_tensor(tokens), as_tensor(positions), meta

    def execute(self, out: SchedulerOutput, rows: dict[str, SamplingRow],
                stop_ids: dict[str, set[int]]) -> StepResult:
        """Copies, one forward, sampling for the requests in `rows` (those whose last token
        is computed this step) and prompt logprobs for requests that asked for them."""
        if self.threads is not None:
            self.threads.update()
        self.copy_blocks(out)
        result = StepResult()
        if not out.scheduled:
            return result
        input_ids, positions, meta = self._prepare(out)
        hidden = self.model(input_ids, positions, (self.k_cache, self.v_cache), meta)
        # Rows of `hidden` whose logits are needed: the last token of each sampling request,
        # and every prompt position of requests that score their prompt.
        wanted, sample_rows, prompt_spans = [], [], []
        offset = 0
        for s in out.scheduled:
            r, start, n = s.request, s.request.num_computed_tokens, s.num_new_tokens
            row = rows.get(r.request_id)
            num_scored = 0
            if row is not None and row.params.prompt_logprobs is not None:
                num_scored = max(0, min(start + n, r.num_prompt_tokens - 1) - start)
            if num_scored:
                targets = r.prompt_token_ids[start + 1:start + 1 + num_scored]
                prompt_spans.append((r.request_id, start + 1, len(wanted), targets,
                                     row.params.prompt_logprobs))
                wanted.extend(range(offset, offset + num_scored))
            if s.samples:
                sample_rows.append((r.request_id, len(wanted)))
                wanted.append(offset + n - 1)
            offset += n
        if not wanted:
            return result
        if len(wanted) < hidden.shape[0]:  # else every row, in order (all decodes)
            hidden = hidden[torch.tensor(wanted, device=self.device)]
        logits = self.model.compute_logits(hidden)
        for request_id, first, at, targets, num in prompt_spans:
            logprobs = torch.log_softmax(logits[at:at + len(targets)], dim=-1)
            result.prompt_logprobs[request_id] = (first, [
                top_logprobs(logprobs[j], token, num) for j, token in enumerate(targets)])
        if sample_rows:
            sampled_logits = logits
            if len(sample_rows) < logits.shape[0]:  # else every row, in order: no copy
                sampled_logits = logits[torch.tensor([at for _, at in sample_rows])]
            ids = [request_id for request_id, _ in sample_rows]
            results = sample(sampled_logits, [rows[i] for i in ids],
                             [stop_ids.get(i, set()) for i in ids], self.generator)
            result.sampled = dict(zip(ids, results))
        return result

