"""The KV cache's tensors: a block's shape and bytes (what the cache's size in blocks follows
from), and the device pools with their host swap pools. A quantized cache (kv_quant.py)
stores kv_format.storage values and fp32 scales: its pools are QuantizedKV pairs."""

from __future__ import annotations

import mmap

import torch

from minivllm.model import kv_quant
from minivllm.model.models import head_dim


class KVPools:
    def __init__(self, block_size: int, kv_dtype: torch.dtype,
                 kv_format: kv_quant.QuantFormat | None, device: torch.device) -> None:
        self.block_size, self.kv_dtype, self.kv_format = block_size, kv_dtype, kv_format
        self.device = device

    def block_shape(self, hf_config) -> tuple[int, ...]:
        """One KV block of one of K and V: [layers, block_size, kv_heads, head_dim]."""
        return (hf_config.num_hidden_layers, self.block_size, hf_config.num_key_value_heads,
                head_dim(hf_config))

    def block_bytes(self, block_shape: tuple[int, ...]) -> int:
        """The bytes of one block of one of K and V: its values, and a quantized cache's
        scales (fp32, one per token and KV head)."""
        values = torch.Size(block_shape).numel()
        if self.kv_format is None:
            return values * self.kv_dtype.itemsize
        return values * self.kv_format.storage.itemsize + values // block_shape[-1] * 4

    def allocate(self, block_shape: tuple[int, ...], num_blocks: int,
                 num_swap_blocks: int) -> tuple:
        """K and V caches (with the padding block), and the host swap pool's K and V, which
        is filled lazily: only swapped-out blocks are ever read. Tensors, or QuantizedKV."""
        layers, *block = block_shape
        shape = (layers, num_blocks + 1, *block)
        host_shape = (layers, num_swap_blocks, *block)
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
