"""The roofline cost model: a step takes as long as its FLOPs at the hardware's compute rate
or its bytes at its memory bandwidth, whichever is longer, plus a fixed per-step overhead and
the swaps at the host link's bandwidth.

- FLOPs: 2 x (the layers' weights + the LM head) per token computed (the head only for the
  rows that sample: one per sequence), and 4 x layers x heads x head_dim per query-key pair
  of attention (QK^T and PV).
- Bytes: every weight read once per step, plus the KV each sequence reads (its context) and
  writes (its new tokens): 2 (K and V) x layers x kv_heads x head_dim x dtype bytes a token.
- Peak rates are datasheet figures; `compute_efficiency` and `bandwidth_efficiency` are the
  fractions a serving engine reaches (our assumption, stated in docs/lab-cost-models.md),
  since nothing runs at a datasheet's peak.
- The KV cache's dtype (--kv-cache-dtype, sim/kv_bytes.py) sets its bytes per token: the
  blocks a memory holds and the bytes each step's KV reads and writes move.
- The prefix cache's disk tier (--kv-offloading-backend disk): its block files at the disk's
  read and write rates (CostModel.disk_time), paid on top of the step.

The model's shape comes from a Hugging Face config.json (no weights needed). KV capacity:
(memory x gpu_memory_utilization - weights - reserved) / KV bytes per block, as vLLM sizes
its cache after loading the weights and profiling a forward pass (`reserved`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path

from minivllm.core.step_batch import StepBatch
from minivllm.sim.cost_model import (
    DEFAULT_DISK_READ_BANDWIDTH,
    DEFAULT_DISK_WRITE_BANDWIDTH,
    CostModel,
)
from minivllm.sim.kv_bytes import kv_bytes_per_token

GIB = 1 << 30
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    dtype_bytes: int

    @classmethod
    def from_config(cls, config: dict, name: str, dtype: str | None = None) -> ModelShape:
        try:
            hidden, heads = config["hidden_size"], config["num_attention_heads"]
            dtype = dtype or config.get("torch_dtype") or config.get("dtype") or "float32"
            if dtype not in DTYPE_BYTES:
                raise ValueError(f"{name}: dtype must be one of {', '.join(DTYPE_BYTES)}, "
                                 f"got {dtype!r}")
            return cls(name, hidden, config["intermediate_size"], config["num_hidden_layers"],
                       heads, config.get("num_key_value_heads") or heads,
                       config.get("head_dim") or hidden // heads, config["vocab_size"],
                       config.get("max_position_embeddings", 2048),
                       bool(config.get("tie_word_embeddings", False)), DTYPE_BYTES[dtype])
        except KeyError as e:
            raise ValueError(f"{name}: config.json lacks {e.args[0]!r}") from None

    @classmethod
    def from_file(cls, path: str | Path, dtype: str | None = None) -> ModelShape:
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        try:
            config = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read a model config.json from {path}: {e}") from None
        return cls.from_config(config, str(path), dtype)

    @property
    def layer_params(self) -> int:
        """Weights of all decoder layers (attention and MLP projections; norms are noise)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return self.num_layers * (2 * h * q + 2 * h * kv + 3 * h * self.intermediate_size)

    @property
    def lora_params_per_rank(self) -> int:
        """A LoRA adapter's weights per unit of rank, on every projection of every layer:
        A and B of each hold rank x (in + out)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        i = self.intermediate_size
        return self.num_layers * ((h + q) * 2 + (h + kv) * 2 + (h + i) * 3)

    @property
    def head_params(self) -> int:
        return self.hidden_size * self.vocab_size

    @property
    def num_params(self) -> int:
        embedding = 0 if self.tie_word_embeddings else self.head_params
        return self.layer_params + self.head_params + embedding

    @property
    def kv_bytes_per_token(self) -> int:
        """At the model's dtype (--kv-cache-dtype auto)."""
        return self.kv_bytes_at("auto")

    def kv_bytes_at(self, kv_cache_dtype: str) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim,
                                  self.dtype_bytes, kv_cache_dtype)


# Qwen/Qwen2.5-7B-Instruct's config.json (the seed report's model), the fields we read.
QWEN25_7B = {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
             "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
             "max_position_embeddings": 32768, "tie_word_embeddings": False,
             "torch_dtype": "bfloat16"}


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # dense, at the model's dtype
    memory_bandwidth: float  # bytes/s
    host_bandwidth: float  # bytes/s, device <-> host (swaps)
    memory_bytes: float  # what the KV cache and the weights share
    step_overhead_s: float  # scheduling, launches, sampling: paid once per step
    compute_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    gpu_memory_utilization: float = 0.9
    reserved_bytes: float = 1.5 * GIB  # activations and runtime, kept out of the KV cache
    kv_cache_bytes: float | None = None  # a fixed KV cache (CPU: the engine's kv_cache_space)
    disk_read_bandwidth: float = DEFAULT_DISK_READ_BANDWIDTH  # bytes/s, the disk tier's files
    disk_write_bandwidth: float = DEFAULT_DISK_WRITE_BANDWIDTH


HARDWARE = {
    # NVIDIA Ada whitepaper: 165.2 dense FP16 tensor TFLOPS with FP32 accumulate, 1008 GB/s
    # GDDR6X, 24 GB; PCIe 4.0 x16 (32 GB/s a direction, ~25 reached).
    "rtx4090": Hardware("rtx4090", 165.2e12, 1008e9, 25e9, 24 * GIB, 0.005),
    # NVIDIA A100 datasheet (SXM 80GB): 312 dense BF16/FP16 TFLOPS, 2039 GB/s; PCIe 4.0 host.
    "a100-80g": Hardware("a100-80g", 312e12, 2039e9, 25e9, 80 * GIB, 0.004),
    # NVIDIA H100 datasheet (SXM): 989 dense BF16/FP16 TFLOPS, 3.35 TB/s; PCIe 5.0 host.
    "h100-80g": Hardware("h100-80g", 989e12, 3350e9, 50e9, 80 * GIB, 0.003),
    # This machine (2 vCPUs of an AMD EPYC, AVX-512), measured 2026-11-23 13:10 UTC under a
    # load average of 3.1: float32 matmul 2048^2 ~52 GFLOP/s (numpy and torch alike), array
    # copies 7.5-25 GB/s read + write; these are achieved rates (efficiencies 1). The step
    # overhead is the fixed term `sim calibrate` fitted on stories260K (~2 ms). KV: the
    # engine's default kv_cache_space of 4 GiB. Disk tier: DiskKVStore writing then loading
    # 40 blocks of 0.9 MiB into a temporary folder, ~0.42 GB/s read and ~0.37 GB/s written
    # (2026-11-28, an Intel Xeon, 2 vCPUs shared with other jobs: checksums and copies
    # bound it).
    "cpu": Hardware("cpu", 50e9, 10e9, 10e9, 0, 0.002, 1.0, 1.0, 1.0, 0, 4 * GIB, 0.4e9,
                    0.35e9),
}
# Preset name -> (hardware, built-in model shape or None for the demo model's config.json).
PRESETS = {
    "rtx4090-qwen2.5-7b": ("rtx4090", "qwen2.5-7b"),
    "a100-80g": ("a100-80g", "qwen2.5-7b"),
    "h100-80g": ("h100-80g", "qwen2.5-7b"),
    "cpu": ("cpu", "minivllm-demo"),
}
PRESET_DTYPE = {"rtx4090": "float16", "a100-80g": "bfloat16", "h100-80g": "bfloat16",
                "cpu": "float32"}


def builtin_shape(name: str, dtype: str) -> ModelShape:
    if name == "qwen2.5-7b":
        return ModelShape.from_config(QWEN25_7B, "Qwen/Qwen2.5-7B-Instruct (shape)", dtype)
    demo = resources.files("minivllm") / "demo_model" / "config.json"
    return ModelShape.from_config(json.loads(demo.read_text()), "minivllm-demo", dtype)


class RooflineCostModel(CostModel):
    def __init__(self, hardware: Hardware, shape: ModelShape, preset: str,
                 lora_rank: int = 16, kv_cache_dtype: str = "auto") -> None:
        """`lora_rank`: the rank of the adapters (on every projection) that LoRA requests
        run: each of their tokens costs 2 x rank x lora_params_per_rank flops more, and
        each adapter in a step reads its weights once."""
        self.hw, self.shape = hardware, shape
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_bytes_per_token = shape.kv_bytes_at(kv_cache_dtype)
        self.disk_read_bandwidth = hardware.disk_read_bandwidth
        self.disk_write_bandwidth = hardware.disk_write_bandwidth
        self._lora_params = lora_rank * shape.lora_params_per_rank
        self.name = f"roofline:{preset}"
        self._flops_rate = hardware.peak_flops * hardware.compute_efficiency
        self._byte_rate = hardware.memory_bandwidth * hardware.bandwidth_efficiency
        self._weight_bytes = (shape.layer_params + shape.head_params) * shape.dtype_bytes
        self._attn_flops = 4 * shape.num_layers * shape.num_heads * shape.head_dim

    def step_time(self, b: StepBatch) -> float:
        s = self.shape
        sampled = b.num_prefill_seqs + b.num_decode_seqs
        flops = (2 * s.layer_params * b.num_tokens + 2 * s.head_params * sampled
                 + self._attn_flops * (b.prefill_attention + b.decode_context)
                 + 2 * self._lora_params * b.num_lora_tokens)
        kv_tokens = b.prefill_context + b.decode_context + b.num_prefill_tokens
        bytes_moved = (self._weight_bytes + self.kv_bytes_per_token * kv_tokens
                       + self._lora_params * s.dtype_bytes * b.num_loras)
        swap = b.num_swap_tokens * self.kv_bytes_per_token / self.hw.host_bandwidth
        return (max(flops / self._flops_rate, bytes_moved / self._byte_rate)
                + self.hw.step_overhead_s + swap + self.disk_time(b))

    def num_kv_blocks(self, block_size: int) -> int:
        hw, block = self.hw, self.kv_bytes_per_token * block_size
        if hw.kv_cache_bytes is not None:
            return int(hw.kv_cache_bytes // block)
        free = (hw.memory_bytes * hw.gpu_memory_utilization - self.shape.num_params
                * self.shape.dtype_bytes - hw.reserved_bytes)
        if free < block:
            raise ValueError(f"{self.shape.name} ({self.shape.num_params / 1e9:.2f}B parameters) "
                             f"leaves no KV cache on {hw.name}")
        return int(free // block)

    def num_swap_blocks(self, block_size: int, swap_space_gib: float) -> int:
        return int(swap_space_gib * GIB // (self.kv_bytes_per_token * block_size))

    def max_model_len(self) -> int:
        return self.shape.max_position_embeddings

    def describe(self) -> dict:
        return {"name": self.name, "hardware": asdict(self.hw), "model": asdict(self.shape),
                "num_params": self.shape.num_params, "kv_cache_dtype": self.kv_cache_dtype,
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "disk_read_bandwidth": self.disk_read_bandwidth,
                "disk_write_bandwidth": self.disk_write_bandwidth}


def roofline_from_preset(preset: str, model_config: str | None = None,
                         gpu_memory_utilization: float | None = None,
                         lora_rank: int = 16, kv_cache_dtype: str = "auto"
                         ) -> RooflineCostModel:
    if preset in PRESETS:
        hw_name, model = PRESETS[preset]
    elif preset in HARDWARE:
        hw_name, model = preset, "qwen2.5-7b" if preset != "cpu" else "minivllm-demo"
    else:
        raise ValueError(f"unknown roofline preset {preset!r}; choose from "
                         f"{', '.join(sorted(set(PRESETS) | set(HARDWARE)))}")
    hw = HARDWARE[hw_name]
    if gpu_memory_utilization is not None:
        hw = replace(hw, gpu_memory_utilization=gpu_memory_utilization)
    dtype = PRESET_DTYPE[hw_name]
    shape = (ModelShape.from_file(model_config, dtype) if model_config
             else builtin_shape(model, dtype))
    return RooflineCostModel(hw, shape, preset, lora_rank, kv_cache_dtype)
