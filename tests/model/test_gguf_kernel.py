"""GGUF blocks as stored (minivllm/model/kernels/gguf_blocks.py, linear/gguf.py, gguf_gemm.c),
every type the kernels run: the torch dequantization equals the gguf package's bit for bit
(on quantized weights, and on random bytes: every bit pattern of every field), and the C
kernel equals the torch emulation of what it computes (int8 activation blocks x the weight
blocks' integers) and stays close to the reference (dequantized weights, F.linear), on tiny
shapes and real ones (SmolLM2's; Qwen2.5-0.5B's 896 x 896, 4864 x 896, 896 x 4864 and rows
of its 151936 x 896 vocabulary). test_kernel_isa.py runs the kernel tests once per ISA level
of this CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from minivllm.model.kernels import gguf_ops, library, linear_ops
from minivllm.model.kernels.gguf_blocks import (
    K_TYPES,
    Q2_K,
    Q3_K,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    TYPE_NAMES,
    UNIT_BYTES,
    UNIT_VALUES,
)
from minivllm.model.linear.gguf import (
    BlockRows,
    BlockWeight,
    GGUFLinear,
    cat_rows,
    emulate_amx,
    emulate_kernel,
)
from tests.kernel_marks import needs_kernels
from tests.model.q4_k_blocks import quantize_q4_k

TYPES = list(TYPE_NAMES)
QUANTIZABLE = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)  # the gguf package writes these (Q4_K: q4_k_blocks)
# Where each type's fp16 scales (and minima) lie in its unit
FP16_FIELDS = {Q4_0: (0,), Q4_1: (0, 2), Q5_0: (0,), Q5_1: (0, 2), Q8_0: (0,), Q2_K: (80, 82),
               Q3_K: (108,), Q4_K: (0, 2), Q5_K: (0, 2), Q6_K: (208,)}


def random_blocks(n: int, k: int, qtype: int, seed: int = 0) -> np.ndarray:
    """Random bytes as blocks [n, k / unit values * unit bytes]: every integer and integer
    scale field takes any value; the fp16 ones are finite (about 0.01, either sign)."""
    rng = np.random.default_rng(seed)
    units = rng.integers(0, 256, (n, k // UNIT_VALUES[qtype], UNIT_BYTES[qtype]), np.uint8)
    for at in FP16_FIELDS[qtype]:
        half = (rng.standard_normal(units.shape[:2]) * 0.01).astype(np.float16)
        units[..., at:at + 2] = half[..., None].view(np.uint8)
    return units.reshape(n, -1)


def block_weight(n: int, k: int, qtype: int, seed: int = 0) -> tuple[BlockWeight, np.ndarray]:
    """Weights [n, k] as blocks: random weights quantized by the gguf package (Q4_K: by
    q4_k_blocks), or random blocks for the types nothing here writes; and the gguf
    package's dequantization of them."""
    if qtype in QUANTIZABLE or qtype == Q4_K:
        w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.05
        w[0, :32] = 0  # an all-zero block: scale 0
        w[-1, -64:] += 0.3  # a block of 32 with a minimum of 0 (all values positive)
        raw = quantize_q4_k(w) if qtype == Q4_K else quantize(w, GGMLQuantizationType(qtype))
    else:
        raw = random_blocks(n, k, qtype, seed)
    return (BlockWeight(qtype, torch.from_numpy(raw.copy())),
            dequantize(raw, GGMLQuantizationType(qtype)))


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_equals_gguf_package(qtype):
    weight, expected = block_weight(40, 512, qtype)
    assert weight.shape == (40, 512)
    assert torch.equal(weight.dequantize(), torch.from_numpy(expected))
    raw = random_blocks(40, 512, qtype, seed=1)
    assert torch.equal(BlockWeight(qtype, torch.from_numpy(raw)).dequantize(),
                       torch.from_numpy(dequantize(raw, GGMLQuantizationType(qtype))))


@pytest.mark.parametrize("qtype", TYPES)
def test_lookup_dequantizes_only_the_rows_asked_for(qtype):
    weight, expected = block_weight(40, 512, qtype)
    ids = torch.tensor([[3, 0], [39, 3]])
    assert torch.equal(weight.lookup(ids), torch.from_numpy(expected)[ids.flatten()])


def test_cat_rows_keeps_blocks_of_one_type_stacks_several_and_dequantizes_a_mix():
    a, a_ref = block_weight(8, 64, Q8_0, 1)
    b, b_ref = block_weight(4, 64, Q8_0, 2)
    c, c_ref = block_weight(4, 64, Q5_0, 3)
    same = cat_rows([a, b])
    assert isinstance(same, BlockWeight) and same.shape == (12, 64)
    assert torch.equal(same.dequantize(), torch.from_numpy(np.concatenate([a_ref, b_ref])))
    stacked = cat_rows([c, c, a])  # a Q4_K_M file's q / k / v: q and k joined
    assert isinstance(stacked, BlockRows) and stacked.shape == (16, 64)
    assert [(p.qtype, p.shape[0]) for p in stacked.parts] == [(Q5_0, 8), (Q8_0, 8)]
    assert torch.equal(stacked.dequantize(), torch.from_numpy(np.concatenate([c_ref, c_ref,
                                                                              a_ref])))
    mixed = cat_rows([a, torch.from_numpy(c_ref)])  # a part the kernels do not run
    assert torch.equal(mixed, torch.from_numpy(np.concatenate([a_ref, c_ref])))


@pytest.mark.parametrize("qtype", TYPES)
def test_reference_linear_is_f_linear_of_the_dequantized_blocks(qtype):
    weight, expected = block_weight(24, 256, qtype)
    x, bias, residual = torch.randn(3, 256), torch.randn(24), torch.randn(3, 24)
    layer = GGUFLinear(weight, bias, use_kernel=False)
    want = residual + F.linear(x, torch.from_numpy(expected), bias)
    assert torch.equal(layer(x, residual=residual), want)


# SmolLM2's shapes (its LM head's 49152 rows); Qwen2.5-0.5B's q / o (896 x 896) and gate /
# up (4864 x 896) and a 16th of its vocabulary's rows (151936 x 896: the embeddings and LM
# head); Q5_0 and Q8_0 are the types its Q4_K_M file stores at K = 896
SMOLLM2_SHAPES = [(576, 576), (1536, 576), (576, 1536), (49152, 576)]
QWEN_SHAPES = [(896, 896), (4864, 896), (151936 // 16, 896)]
TINY = [(16, 32), (40, 96)]
# The K types' super-blocks need K a multiple of 256: Qwen2.5-0.5B's down_proj (896 x 4864,
# Q4_K and Q6_K in its Q4_K_M file), SmolLM2's down_proj, and a Llama-sized one
K_SHAPES = [(16, 256), (40, 512), (896, 4864)]
CASES = ([(qtype, n, k) for qtype in (Q8_0, Q4_0, Q4_1) for n, k in TINY + SMOLLM2_SHAPES]
         + [(qtype, n, k) for qtype in (Q5_0, Q8_0) for n, k in QWEN_SHAPES]
         + [(Q5_1, n, k) for n, k in TINY + QWEN_SHAPES[:1]]
         + [(qtype, n, k) for qtype in K_TYPES for n, k in K_SHAPES]
         + [(Q4_K, 576, 1536), (Q4_K, 2048, 2048)])


def on_amx(x: torch.Tensor, weight: BlockWeight) -> bool:
    """Whether the product runs amx_gemm.c: from AMX_MIN_ROWS rows of its types where the
    library runs it."""
    return (x.shape[0] >= linear_ops.AMX_MIN_ROWS and weight.qtype in gguf_ops.GGUF_AMX_TYPES
            and library.amx())


def repacked(weight: BlockWeight) -> bool:
    """Whether the weights run repacked (gguf_repacked.c: the int8 kernel's arithmetic at
    every row count)."""
    return library.gguf_repacked() and weight.qtype in gguf_ops.GGUF_REPACKED_TYPES


def on_panels(x: torch.Tensor, weight: BlockWeight) -> bool:
    """Whether the product runs as fp32 panels (gguf_dequant.c and sgemm): from
    GGUF_DEQUANT_MIN_ROWS rows, off AMX, where the weights are not repacked."""
    return (x.shape[0] >= gguf_ops.GGUF_DEQUANT_MIN_ROWS and not on_amx(x, weight)
            and not repacked(weight))


def emulated(x: torch.Tensor, weight: BlockWeight) -> torch.Tensor:
    """What the kernels compute: amx_gemm.c's, the fp32 panels' or gguf_gemm.c's."""
    if on_amx(x, weight):
        return emulate_amx(x, weight)
    return F.linear(x, weight.dequantize()) if on_panels(x, weight) else emulate_kernel(x, weight)


@needs_kernels
@pytest.mark.parametrize("qtype,n,k", CASES)
@pytest.mark.parametrize("rows", [1, 5, 33])
def test_kernel_matches_torch(qtype, n, k, rows):
    weight, dequantized = block_weight(n, k, qtype, seed=n + k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(n + k + rows))
    x[0, 32:64] = 0  # an all-zero activation block
    x[-1, :3] = torch.tensor([40.0, -40.0, 1e-3])  # an outlier
    y = GGUFLinear(weight)(x)
    # The same integer sums (or bf16 products), accumulated in another order: fp32 rounding
    # only.
    expected = emulated(x, weight)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-4 * expected.abs().max().item())
    # Against the dequantized weights in fp32, per value: within what rounding x costs,
    # sum |w| * (half a step of x's int8 block: max|x| / 254; on AMX tiles, x and w rounded
    # to bf16: 2^-8 of |x| |w|), plus fp32 sums' rounding.
    w = torch.from_numpy(dequantized)
    reference = F.linear(x, w)
    if on_amx(x, weight):
        step = x.abs() * 2.0 ** -8
    elif on_panels(x, weight):
        step = torch.zeros_like(x)
    else:
        step = x.reshape(rows, -1, 32).abs().amax(dim=2).repeat_interleave(32, dim=1) / 254
    bound = F.linear(step, w.abs()) + 1e-5 * F.linear(x.abs(), w.abs())
    assert ((y - reference).abs() <= bound).all(), ((y - reference).abs() / bound).max()
    if qtype in QUANTIZABLE or qtype == Q4_K:  # trained-like weights, not random bytes:
        # about 1%, up to 3% where the outlier row is the only one and K one block (its 29
        # other values then round to steps of 40 / 127)
        error = (y - reference).norm() / reference.norm()
        assert error < (0.03 if rows == 1 and k == 32 else 0.02), error


@needs_kernels
@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("rows", [4, 40])
def test_kernel_adds_bias_and_residual_and_reads_strided_rows(qtype, rows):
    weight, _ = block_weight(48, 256, qtype)
    wide = torch.randn(rows, 512)
    x = wide[:, :256]  # rows strided by 512
    bias, residual = torch.randn(48), torch.randn(rows, 48)
    layer = GGUFLinear(weight, bias)
    product = emulated(x.contiguous(), weight)  # random bytes' products reach ~1e3
    torch.testing.assert_close(layer(x, residual=residual), residual + product + bias,
                               rtol=1e-5, atol=1e-5 * (1 + product.abs().max().item()))
    assert torch.equal(layer(torch.zeros(rows, 256)), bias.expand(rows, 48))


@needs_kernels
@pytest.mark.parametrize("rows", [1, 40])
def test_stacked_types_run_each_part_into_its_columns(rows):
    """A q / k / v of Q5_0, Q5_0 and Q8_0 rows: one kernel call per part, bias and residual
    taken by columns."""
    parts = [block_weight(n, 896, qtype, seed=n)[0]
             for n, qtype in ((896, Q5_0), (128, Q5_0), (128, Q8_0))]
    x, bias, residual = torch.randn(rows, 896), torch.randn(1152), torch.randn(rows, 1152)
    y = GGUFLinear(cat_rows(parts), bias)(x, residual=residual)
    expected = torch.cat([emulated(x, part) for part in parts], dim=1) + bias + residual
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-4)


@needs_kernels
def test_types_amx_does_not_unpack_never_reach_it(monkeypatch):
    """On a CPU with AMX (pretended here), a prefill of GGUF_AMX_TYPES calls amx_gemm.c (here
    refused: the fp32 panels run) and one of the other types runs as it would without AMX,
    without asking amx_gemm.c first."""
    real = library._library()
    asked = []

    class Library:
        def __getattr__(self, name):
            return getattr(real, name)

        def gguf_linear_amx_f32(self, **kwargs):
            asked.append(kwargs["qtype"])
            return -1  # as a library without AMX does: the caller runs gguf_gemm.c

    monkeypatch.setattr(library, "_library", Library)
    monkeypatch.setattr(library, "amx", lambda: True)
    x = torch.randn(linear_ops.AMX_MIN_ROWS, 256)
    for qtype in TYPES:
        weight, _ = block_weight(16, 256, qtype)
        expected = (F.linear(x, weight.dequantize()) if qtype in gguf_ops.GGUF_AMX_TYPES
                    else emulated(x, weight))
        torch.testing.assert_close(GGUFLinear(weight)(x), expected, rtol=1e-5, atol=1e-4)
    assert asked == [q for q in TYPES if q in gguf_ops.GGUF_AMX_TYPES] == [Q4_0, Q4_1, Q8_0, Q4_K]


@needs_kernels
@pytest.mark.parametrize("qtype", gguf_ops.GGUF_AMX_TYPES)
def test_amx_path_runs_from_its_row_count(qtype):
    """From AMX_MIN_ROWS rows, amx_gemm.c: bf16 activations, so not the int8 kernel's
    results; 40 columns (the last panel paired with itself, 8 of its columns past n); one
    row fewer runs the fp32 panels (or gguf_gemm.c below GGUF_DEQUANT_MIN_ROWS)."""
    if not library.amx():
        pytest.skip("the kernels run no AMX here (no amx_bf16, or MINIVLLM_ISA forced a "
                    "lower level)")
    weight, _ = block_weight(40, 256, qtype)
    x = torch.randn(linear_ops.AMX_MIN_ROWS, 256)
    y = GGUFLinear(weight)(x)
    torch.testing.assert_close(y, emulate_amx(x, weight), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(y, emulate_kernel(x, weight), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(GGUFLinear(weight)(x[1:]), emulated(x[1:], weight),
                               rtol=1e-5, atol=1e-5)


@needs_kernels
def test_kernel_reads_every_finite_fp16_scale_and_minimum_exactly():
    """The kernel converts each block's fp16 d and m itself (gguf_scales.h; without F16C,
    bit by bit): every finite fp16, subnormals, zeros and both signs among them, one block
    per output, so each output is one block's d (Q8_0) or m (Q4_1, its integers 0) times
    the activation's scale and integer sum (Q8_0's integers past the first 4 are 0: one
    int32 lane, whose product is then the kernel's one rounding, as the emulation's)."""
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    halves = halves[np.isfinite(halves)]
    x = torch.randn(1, 32, generator=torch.Generator().manual_seed(0))
    for qtype, at in ((Q8_0, 0), (Q4_1, 2)):
        units = np.zeros((len(halves), UNIT_BYTES[qtype]), np.uint8)
        units[:, 2:6] = np.random.default_rng(0).integers(0, 256, (len(halves), 4))
        if qtype == Q4_1:  # d 1, integers 0: the minimum alone
            units[:, 0:2] = np.full((len(halves), 1), 1.0, np.float16).view(np.uint8)
            units[:, 4:] = 0
        units[:, at:at + 2] = halves.reshape(-1, 1).view(np.uint8)
        weight = BlockWeight(qtype, torch.from_numpy(units))
        torch.testing.assert_close(GGUFLinear(weight)(x), emulate_kernel(x, weight),
                                   rtol=1e-6, atol=0)


@needs_kernels
def test_kernel_refuses_another_type_and_a_k_type_off_256():
    with pytest.raises(ValueError, match="not a block type the kernel reads"):  # F16
        gguf_ops.gguf_linear(torch.randn(1, 32), torch.zeros(1, 64, dtype=torch.uint8), 1, None,
                             None, 1)
    for qtype in K_TYPES:  # K = 32
        unit = torch.zeros(1, UNIT_BYTES[qtype], dtype=torch.uint8)
        with pytest.raises(ValueError, match="super-blocks of 256"):
            gguf_ops.gguf_linear(torch.randn(1, 32), unit, qtype, None, None, 1)
