"""A 7B-class benchmark model where the registries ship none: a Q4_K_M GGUF file shaped like
Qwen2.5-7B-Instruct or Llama-3-8B whose quantized blocks are drawn at random (a seeded
generator) from the blocks of the same type in Qwen2.5-Coder-0.5B-Instruct's Q4_K_M file
(qwen25_coder.py): every block's scales are trained values, so nothing overflows, and a
decode step reads the bytes and runs the kernels the real model would. Norm weights and
Qwen2's q/k/v biases are drawn value by value from the 0.5B's tensors of the same role.

The tokenizer is the 0.5B's, its metadata copied verbatim, so the vocabulary is 151936 for
both shapes: Qwen2.5-7B's embeddings have 152064 rows (padding), Llama-3-8B's 128256, which
makes this Llama-3-8B's embeddings and LM head 18% bigger than the real model's (the command
line prints the file's and the real model's parameters and bytes read per decode token:
qwen2.5-7b 7.615 B and 4.370 GB, real 7.616 B and 4.371 GB; llama-3-8b 8.224 B and 4.697 GB,
real 8.030 B and 4.617 GB).

The weights are noise and so is the text: time it with EOS ignored. Files go to the model
cache ($MINIVLLM_CACHE/models), never the repository:

    python -m minivllm.bench.synthetic_gguf qwen2.5-7b   # 4.68 GB; llama-3-8b: 5.05 GB

Written tensor by tensor (about a minute; peak memory 1.1 GB, the LM head's blocks).

Tensor types follow llama.cpp's Q4_K_M recipe (llama_tensor_get_type): the LM head Q6_K;
attn_v and ffn_down Q6_K in the layers use_more_bits picks (the first and last eighth and
every third between), Q4_K elsewhere; every other matrix, the token embeddings included,
Q4_K; 1-D tensors F32. llama.cpp counts attn_v / ffn_down tensors in the order it meets them:
the 0.5B file lists layers as sorted strings (0, 1, 10, 11, ...), so its Q6_K layers look
scattered; this file lists them in order, so the count is the layer."""

from __future__ import annotations

import argparse
import hashlib
import math
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter

from minivllm.bench.qwen25_coder import models_dir, qwen25_coder_gguf
from minivllm.model.gguf import open_gguf

F32, Q4_K, Q5_0, Q6_K, Q8_0 = (GGMLQuantizationType.F32, GGMLQuantizationType.Q4_K,
                               GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q6_K,
                               GGMLQuantizationType.Q8_0)
# llama.cpp's types for a row length that is not a multiple of a K-quant's 256 values (the
# 0.5B's hidden size, 896, is not: most of its matrices are Q5_0 and Q8_0)
FALLBACK = {Q4_K: Q5_0, Q6_K: Q8_0}
MOSTLY_Q4_K_M = 15  # general.file_type


@dataclass(frozen=True)
class Shape:
    """A model's shape as its GGUF metadata states it; the vocabulary is the 0.5B's."""

    name: str
    architecture: str  # general.architecture: qwen2 or llama
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    rope_theta: float
    context_length: int
    rms_norm_eps: float
    qkv_bias: bool  # Qwen2's q/k/v projections have biases, Llama's none
    real_vocab: int  # the real model's vocabulary: for comparing sizes only

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SHAPES = {
    "qwen2.5-7b": Shape("qwen2.5-7b", "qwen2", layers=28, hidden=3584, intermediate=18944,
                        heads=28, kv_heads=4, rope_theta=1e6, context_length=32768,
                        rms_norm_eps=1e-6, qkv_bias=True, real_vocab=152064),
    "llama-3-8b": Shape("llama-3-8b", "llama", layers=32, hidden=4096, intermediate=14336,
                        heads=32, kv_heads=8, rope_theta=500000.0, context_length=8192,
                        rms_norm_eps=1e-5, qkv_bias=False, real_vocab=128256),
}


@dataclass(frozen=True)
class PlannedTensor:
    name: str  # GGUF's: blk.3.attn_v.weight
    role: str  # the name less blk.N. and .weight: attn_v, attn_q.bias, output_norm
    shape: tuple[int, ...]  # numpy order: (rows, row length) or (length,)
    type: GGMLQuantizationType

    @property
    def nbytes(self) -> int:
        values_per_block, block_bytes = GGML_QUANT_SIZES[self.type]
        return math.prod(self.shape) // values_per_block * block_bytes


def use_more_bits(index: int, count: int) -> bool:
    """llama.cpp's choice of the attn_v / ffn_down tensors that get more bits."""
    return index < count // 8 or index >= 7 * count // 8 or (index - count // 8) % 3 == 2


def q4_k_m_type(role: str, index: int, count: int, row_length: int) -> GGMLQuantizationType:
    """llama.cpp's Q4_K_M type for a matrix of this role: `index` is its place among the
    `count` matrices of the role in the order llama.cpp meets them (only attn_v's and
    ffn_down's types depend on it), `row_length` its values per row."""
    more_bits = role in ("attn_v", "ffn_down") and use_more_bits(index, count)
    wanted = Q6_K if role == "output" or more_bits else Q4_K
    return wanted if row_length % 256 == 0 else FALLBACK[wanted]


def plan(shape: Shape, vocab: int) -> list[PlannedTensor]:
    """The file's tensors in the order written: embeddings, each layer, final norm, LM head."""
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    attention = {"attn_q": (h, h), "attn_k": (kv, h), "attn_v": (kv, h), "attn_output": (h, h)}
    mlp = {"ffn_gate": (shape.intermediate, h), "ffn_up": (shape.intermediate, h),
           "ffn_down": (h, shape.intermediate)}

    def matrix(prefix: str, role: str, dims: tuple[int, int], layer: int = 0):
        return PlannedTensor(f"{prefix}{role}.weight", role, dims,
                             q4_k_m_type(role, layer, shape.layers, dims[1]))

    tensors = [matrix("", "token_embd", (vocab, h))]
    for layer in range(shape.layers):
        prefix = f"blk.{layer}."
        tensors.append(PlannedTensor(f"{prefix}attn_norm.weight", "attn_norm", (h,), F32))
        for role, dims in attention.items():
            tensors.append(matrix(prefix, role, dims, layer))
            if shape.qkv_bias and role != "attn_output":
                tensors.append(PlannedTensor(f"{prefix}{role}.bias", f"{role}.bias",
                                             (dims[0],), F32))
        tensors.append(PlannedTensor(f"{prefix}ffn_norm.weight", "ffn_norm", (h,), F32))
        tensors.extend(matrix(prefix, role, dims, layer) for role, dims in mlp.items())
    tensors.append(PlannedTensor("output_norm.weight", "output_norm", (h,), F32))
    tensors.append(matrix("", "output", (vocab, h)))
    return tensors


def bytes_per_decode_token(tensors: list[PlannedTensor]) -> int:
    """The weights a decode step reads: all but the token embeddings (one row is looked up),
    the LM head included."""
    return sum(t.nbytes for t in tensors if t.role != "token_embd")


def role_of(name: str) -> str:
    parts = name.removesuffix(".weight").split(".")
    return ".".join(parts[2:] if parts[0] == "blk" else parts)


class Source:
    """The 0.5B file: its tokenizer, its blocks by type and its F32 values by role."""

    def __init__(self, path: Path) -> None:
        self.reader = open_gguf(path)
        self.vocab = len(self.reader.fields["tokenizer.ggml.tokens"].data)
        values = defaultdict(list)
        for tensor in self.reader.tensors:
            if tensor.tensor_type == F32:
                values[role_of(tensor.name)].append(np.asarray(tensor.data).ravel())
        self.values = {role: np.concatenate(parts) for role, parts in values.items()}
        self._blocks: dict[GGMLQuantizationType, np.ndarray] = {}

    def blocks(self, kind: GGMLQuantizationType) -> np.ndarray:
        """Every block of this type in the file, one row each (gathered on first use)."""
        if kind not in self._blocks:
            block_bytes = GGML_QUANT_SIZES[kind][1]
            self._blocks[kind] = np.concatenate([
                np.asarray(t.data).reshape(-1, block_bytes)
                for t in self.reader.tensors if t.tensor_type == kind])
        return self._blocks[kind]

    def draw(self, tensor: PlannedTensor, rng: np.random.Generator) -> np.ndarray:
        """The tensor's data: values or whole blocks drawn from the source's of its kind."""
        if tensor.type == F32:
            pool = self.values[tensor.role]
            return pool[rng.integers(0, len(pool), tensor.shape)]
        pool = self.blocks(tensor.type)
        rows, row_length = tensor.shape
        picks = rng.integers(0, len(pool), (rows, row_length // GGML_QUANT_SIZES[tensor.type][0]))
        return pool[picks].reshape(rows, -1)


def copy_field(writer: GGUFWriter, field) -> None:
    kind = field.types[0]
    sub_type = field.types[-1] if kind == GGUFValueType.ARRAY else None
    writer.add_key_value(field.name, field.contents(), kind, sub_type)


def write(path: Path, shape: Shape, source: Source, tensors: list[PlannedTensor],
          seed: int) -> None:
    """The file, tensor by tensor: one tensor's data in memory at a time."""
    writer = GGUFWriter(path, shape.architecture)
    writer.add_type("model")
    writer.add_name(f"synthetic {shape.name} Q4_K_M (blocks of Qwen2.5-Coder-0.5B, seed {seed})")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_norm_eps)
    writer.add_file_type(MOSTLY_Q4_K_M)
    writer.add_quantization_version(2)
    for field in source.reader.fields.values():
        if field.name.startswith("tokenizer."):
            copy_field(writer, field)
    for t in tensors:
        if t.type == F32:
            writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes)
        else:
            byte_shape = (t.shape[0], t.nbytes // t.shape[0])
            writer.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), t.nbytes, t.type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for t in tensors:
        writer.write_tensor_data(source.draw(t, rng))
    writer.close()


def synthetic_gguf(shape: str | Shape, seed: int = 0, directory: Path | None = None) -> Path:
    """The file for a shape of SHAPES (or any Shape) and seed, written on first use to the
    model cache (or `directory`) under a temporary name renamed into place, so a half-written
    file is never taken for the model. The name holds the shape's name, a digest of its
    fields and the seed."""
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    digest = hashlib.sha256(repr(shape).encode()).hexdigest()[:8]
    target = (directory or models_dir()) / f"synthetic-{shape.name}-{digest}-q4_k_m-seed{seed}.gguf"
    if target.exists():
        return target
    source = Source(qwen25_coder_gguf())
    tensors = plan(shape, source.vocab)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        write(partial, shape, source, tensors, seed)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m minivllm.bench.synthetic_gguf",
        description="Write (once) a 7B-class Q4_K_M GGUF file of blocks drawn from "
                    "Qwen2.5-Coder-0.5B's; print its path and sizes. Its text is noise: time "
                    "it with EOS ignored.")
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    shape = SHAPES[args.shape]
    path = synthetic_gguf(shape, args.seed)
    reader = open_gguf(path)
    tensors = plan(shape, len(reader.fields["tokenizer.ggml.tokens"].data))
    real = plan(shape, shape.real_vocab)
    print(path)
    print(f"tensors: {len(reader.tensors)}, file: {path.stat().st_size / 1e9:.2f} GB")
    for label, which in (("this file", tensors), (f"real ({shape.real_vocab} tokens)", real)):
        print(f"{label}: {sum(math.prod(t.shape) for t in which) / 1e9:.3f} B parameters, "
              f"{bytes_per_decode_token(which) / 1e9:.3f} GB read per decode token")


if __name__ == "__main__":
    main()
