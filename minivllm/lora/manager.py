"""The engine core's adapters: loaded on the first request that names one, kept while any
request holds it, and beyond max_cpu_loras the least recently used idle ones dropped (a
later request loads it again from its path). Each step it tells the LoRALinears which rows
run which adapter (set_step)."""

from __future__ import annotations

from collections import Counter, OrderedDict

import numpy as np
import torch

from minivllm.lora.layers import MAX_PADDING, LoRAStep, install
from minivllm.lora.peft_format import read_adapter
from minivllm.lora.request import LoRARequest
from minivllm.lora.weights import LoRAWeights
from minivllm.model.kernels import library


class LoRAManager:
    def __init__(self, model: torch.nn.Module, hf_config, max_lora_rank: int,
                 max_cpu_loras: int, dtype: torch.dtype, device: torch.device,
                 bf16_weights: bool = False) -> None:
        """dtype: the activations'; bf16_weights: the base's linears are bf16 (--dtype
        bfloat16 on the CPU), and so are the adapters' where the kernel runs."""
        self.hf_config, self.max_lora_rank, self.max_cpu_loras = hf_config, max_lora_rank, \
            max_cpu_loras
        self.device = device
        self.step = LoRAStep()
        # Every step with adapters: lora_sgmv.c where the C kernels run (fp32, CPU).
        self.use_kernel = library.available(device, dtype)
        self.weight_dtype = torch.bfloat16 if bf16_weights and self.use_kernel else dtype
        self.dense_mlp_layers = install(model, self.step)
        self.adapters: OrderedDict[int, tuple[LoRARequest, LoRAWeights]] = OrderedDict()
        self.holders: Counter[int] = Counter()  # lora_int_id -> live requests naming it

    def acquire(self, lora: LoRARequest) -> None:
        """Load the adapter if it is not loaded (a ValueError naming what is wrong with its
        files) and hold it for one more request until release()."""
        loaded = self.adapters.get(lora.lora_int_id)
        if loaded is not None and (loaded[0].lora_name, loaded[0].lora_path) != (
                lora.lora_name, lora.lora_path):
            raise ValueError(f"lora_int_id {lora.lora_int_id} is already the adapter "
                             f"{loaded[0].lora_name!r} ({loaded[0].lora_path}); each adapter "
                             "needs its own id")
        if loaded is None:
            spec = read_adapter(lora.lora_path, self.max_lora_rank)
            weights = LoRAWeights(spec, self.hf_config, self.weight_dtype, self.device,
                                  self.dense_mlp_layers)
            self.adapters[lora.lora_int_id] = (lora, weights)
        self.adapters.move_to_end(lora.lora_int_id)
        self.holders[lora.lora_int_id] += 1
        self._evict()

    def release(self, lora_int_id: int) -> None:
        self.holders[lora_int_id] -= 1
        if self.holders[lora_int_id] <= 0:
            del self.holders[lora_int_id]
        self._evict()

    def _evict(self) -> None:
        """Past max_cpu_loras, drop the least recently used adapters no request holds."""
        idle = [i for i in self.adapters if i not in self.holders]
        for lora_int_id in idle[:max(0, len(self.adapters) - self.max_cpu_loras)]:
            del self.adapters[lora_int_id]

    def set_step(self, lora_ids: list[int], query_start_loc: np.ndarray) -> None:
        """The step's rows per adapter: request i (its LoRA id, 0 for none) owns rows
        query_start_loc[i]:query_start_loc[i + 1] of the flattened batch."""
        step = self.step
        step.groups, step.all_rows, step.gather, step.segments = [], None, None, None
        distinct = set(lora_ids)
        if distinct == {0}:
            return
        if len(distinct) == 1 and not self.use_kernel:
            step.all_rows = self.adapters[lora_ids[0]][1]
            return
        spans: dict[int, list[np.ndarray]] = {}
        for i, lora_id in enumerate(lora_ids):
            if lora_id:
                spans.setdefault(lora_id, []).append(
                    np.arange(query_start_loc[i], query_start_loc[i + 1]))
        # In id order: the same adapters give the same stacks, whatever the batch's order.
        rows = {lora_id: np.concatenate(spans[lora_id]) for lora_id in sorted(spans)}
        if self.use_kernel:
            self._use_adapters(tuple(self.adapters[i][1] for i in rows))
            counts = [len(r) for r in rows.values()]
            step.segments = tuple(self._tensor(a.astype(np.int64)) for a in (
                np.concatenate(list(rows.values())), np.concatenate([[0], np.cumsum(counts)])))
            return
        longest = max(len(r) for r in rows.values())
        total = sum(len(r) for r in rows.values())
        if len(rows) * longest > MAX_PADDING * total:
            step.groups = [(self._tensor(r), self.adapters[i][1]) for i, r in rows.items()]
            return
        self._use_adapters(tuple(self.adapters[i][1] for i in rows))
        # Pad each adapter's rows to the longest with its own first row; `keep` drops them.
        gather = np.stack([np.pad(r, (0, longest - len(r)), mode="edge") for r in rows.values()])
        step.gather = self._tensor(gather)
        step.rows = self._tensor(np.concatenate(list(rows.values())))
        step.keep = None if longest * len(rows) == total else self._tensor(np.concatenate(
            [k * longest + np.arange(len(r)) for k, r in enumerate(rows.values())]))

    def _use_adapters(self, adapters: tuple[LoRAWeights, ...]) -> None:
        step = self.step
        if adapters != step.adapters:  # another set: stack its weights again
            step.adapters, step.stacks, step.kernel_stacks = adapters, {}, {}

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)
