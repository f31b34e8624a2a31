"""What a GGUF model's weights cost a decoded token, for the start log: which tensors run
from which block type (`quantization="gguf"`) or are dequantized to float32, and the bytes
of weights a decode step reads either way. A step reads every linear once, the LM head
included (the token embeddings when the head is tied to them); of the embeddings otherwise
only the looked-up rows, counted as nothing here."""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass

from minivllm.model.kernels.gguf_blocks import UNIT_BYTES

logger = logging.getLogger("minivllm.model.gguf")
EMBEDDINGS = "token_embd.weight"


@dataclass(frozen=True)
class Tensor:
    name: str  # the file's (blk.3.attn_q.weight)
    qtype: str  # the file's type name (Q5_0, F32)
    qtype_id: int
    matrix: bool  # a linear's weight or the embeddings, not a norm or a bias
    values: int
    stored_bytes: int
    as_blocks: bool
    why_not: str = ""  # for a matrix dequantized under quantization="gguf": why


def step_bytes(tensor: Tensor, as_blocks: bool) -> int:
    """Bytes a decode step reads of a tensor it reads whole: gguf_gemm.c reads the blocks as
    stored, their scales and minima among them, and nothing else; float32 4 a value."""
    return tensor.stored_bytes if as_blocks else 4 * tensor.values


class WeightBytes:
    """The tensors a GGUF load produced, added as they load; log() writes the lines."""

    def __init__(self) -> None:
        self.tensors: list[Tensor] = []

    def add(self, tensor: Tensor) -> None:
        self.tensors.append(tensor)

    def log(self, keep_blocks: bool) -> None:
        # What a step reads whole: all but the embeddings, unless the LM head is tied to them
        tied = not any(t.name == "output.weight" for t in self.tensors)
        whole = [t for t in self.tensors if t.name != EMBEDDINGS or tied]
        linears = [t for t in whole if t.matrix]  # the LM head among them
        if not keep_blocks:
            # what quantization="gguf" would read: the types the kernels run as blocks (if
            # the architecture's tensor processor leaves them as they are)
            blocks = sum(step_bytes(t, t.matrix and t.qtype_id in UNIT_BYTES) for t in whole)
            logger.info("GGUF weights dequantized to float32: a decode step reads %s of "
                        "weights in float32 (quantization=gguf: about %s)",
                        _size(sum(step_bytes(t, False) for t in whole)), _size(blocks))
            return
        kept = Counter(t.qtype for t in linears if t.as_blocks)
        dequantized = [t for t in linears if not t.as_blocks]
        embeddings = next((t for t in self.tensors if t.name == EMBEDDINGS), None)
        logger.info(
            "quantization=gguf: %d linears run from their stored blocks (%s), %d dequantized "
            "to float32 (%s)%s", kept.total(), _counts(kept), len(dequantized),
            _counts(Counter(t.qtype for t in dequantized)),
            "" if embeddings is None else f"; token embeddings {embeddings.qtype}, " + (
                "rows dequantized as looked up" if embeddings.as_blocks else
                "dequantized to float32") + (" (the LM head tied to them)" if tied else ""))
        matrices = [t for t in self.tensors if t.matrix]
        logger.info("GGUF tensors by kind (across layers): %s; the other %d tensors in float32",
                    _by_kind(matrices), len(self.tensors) - len(matrices))
        blocks = sum(step_bytes(t, True) for t in whole if t.as_blocks)
        fp32 = sum(step_bytes(t, False) for t in whole if not t.as_blocks)
        logger.info("quantization=gguf: a decode step reads %s of weights (blocks %s, "
                    "float32 %s)", _size(blocks + fp32), _size(blocks), _size(fp32))
        if dequantized:
            extra = sum(step_bytes(t, False) - t.stored_bytes for t in dequantized)
            why = Counter(f"{t.qtype}, {t.why_not}" for t in dequantized)
            logger.warning("quantization=gguf: %d linears dequantized to float32 (%s): +%s "
                           "read per decoded token", len(dequantized), _counts(why),
                           _size(extra))


def _by_kind(matrices: list[Tensor]) -> str:
    """'attn_v Q5_0 x12 + Q8_0 x12, output Q8_0, ...' in the file's order."""
    kinds: dict[str, Counter] = {}
    for t in matrices:
        kind = re.sub(r"^blk\.\d+\.", "", t.name).removesuffix(".weight")
        kinds.setdefault(kind, Counter())[t.qtype] += 1
    return ", ".join(f"{kind} " + " + ".join(f"{q} x{n}" if n > 1 else q
                                            for q, n in sorted(types.items()))
                     for kind, types in kinds.items())


def _counts(counts: Counter) -> str:
    return ", ".join(f"{name}: {count}" for name, count in sorted(counts.items())) or "none"


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'GB' else 1}f} {unit}"
    return f"{n / 1e3:.1f} kB"
