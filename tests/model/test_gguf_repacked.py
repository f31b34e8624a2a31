"""GGUF weights repacked at load into panels of 16 columns (gguf_repack.c, gguf_repacked.c;
AVX-512 VNNI and AVX2 variants, test_kernel_isa.py runs this file at every level):
the same arithmetic as gguf_gemm.c on the blocks as stored (emulate_kernel) at every row
count — decode rows, a verify step's, a prompt's, across the kernel's tiles (AVX-512: all
of up to 8 rows times one panel; past 8 rows, 6 rows times two panels, Q6_K 4; AVX2: 4 rows)
and tasks of 64 — on tiny shapes, column counts off 16 and Qwen2.5-0.5B's; a row's result
bit for bit the same alone or in any batch; the bytes a step reads those of the file.
The rest of the GGUF kernel tests (test_gguf_kernel.py) run through the same GGUFLinear, so
on this CPU they test this route too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm.model.kernels import fused_ops, gguf_ops, library
from minivllm.model.kernels.gguf_blocks import (
    BLOCK,
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
    BlockWeight,
    GGUFLinear,
    emulate_kernel,
    quantize_blocks,
)
from tests.kernel_marks import needs_kernels
from tests.model.test_gguf_kernel import block_weight

pytestmark = needs_kernels


def repacked_layer(weight, bias=None) -> GGUFLinear | None:
    """The layer over `weight`, or None below AVX2, where nothing repacks (checked: the
    blocks stay; test_gguf_kernel.py tests that route). Asked at each test, not skipped:
    test_kernel_isa.py runs this file under every level's library, each level all tests."""
    layer = GGUFLinear(weight, bias)
    if not library.gguf_repacked():
        assert layer.repacked == [None] and layer.blocks == [weight.blocks]
        return None
    return layer

REPACKED = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K]
# Tiny, columns off 16 (a last panel of 5 and of 8 columns), and Qwen2.5-0.5B's q / k / v
# and gate (Q5_0, Q8_0 in its Q4_K_M file at K = 896) and down (Q4_K, Q6_K at K = 4864)
SHAPES = {Q4_0: [(16, 32), (37, 96)], Q4_1: [(16, 32), (40, 96)],
          Q5_0: [(37, 64), (896, 896), (128, 896), (4864, 896)],
          Q5_1: [(16, 32), (40, 64)], Q8_0: [(37, 64), (128, 896)],
          Q4_K: [(40, 512), (896, 4864)], Q5_K: [(37, 256)], Q6_K: [(40, 512), (896, 4864)]}
CASES = [(qtype, n, k) for qtype in REPACKED for n, k in SHAPES[qtype]]


@pytest.mark.parametrize("qtype,n,k", CASES, ids=lambda v: TYPE_NAMES.get(v, str(v)))
@pytest.mark.parametrize("rows", [1, 4, 8, 9, 14, 70])
def test_repacked_equals_the_int8_kernels_arithmetic(qtype, n, k, rows):
    weight, _ = block_weight(n, k, qtype, seed=n + k)
    layer = repacked_layer(weight)
    if layer is None:
        return
    assert layer.repacked[0] is not None and layer.blocks[0] is None  # the blocks let go
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    x[0, :32] = 0  # an all-zero activation block
    expected = emulate_kernel(x, weight)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5,
                               atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("qtype", REPACKED, ids=lambda v: TYPE_NAMES[v])
def test_a_rows_result_does_not_depend_on_its_batch(qtype):
    """Bit for bit: a row alone (a decode step), among 3 or 8, past a tile of 8 (9) and past
    a task of 64 rows (a prompt of 70): what a cached re-send needs to decode the same. The
    blocks route (fp32 panels from GGUF_DEQUANT_MIN_ROWS rows) fails this."""
    k = 512 if qtype in (Q4_K, Q5_K, Q6_K) else 96
    weight, _ = block_weight(37, k, qtype)
    layer = repacked_layer(weight, torch.randn(37))
    if layer is None:
        return
    x = torch.randn(70, k)
    alone = torch.cat([layer(x[i:i + 1]) for i in range(70)])
    for rows in (3, 8, 9, 64, 70):
        assert torch.equal(layer(x[:rows]), alone[:rows]), rows
    assert torch.equal(layer(x[5:70]), alone[5:70])  # a row at another place in its tile


@pytest.mark.parametrize("qtype", REPACKED, ids=lambda v: TYPE_NAMES[v])
def test_repacked_reads_the_files_bytes(qtype):
    """Q4_K / Q5_K keep their 6-bit scales and minima as bytes: 1/64 byte per weight more."""
    n, k = 64, 512
    weight, _ = block_weight(n, k, qtype)
    stored = n * k // UNIT_VALUES[qtype] * UNIT_BYTES[qtype]
    extra = n * k // 64 if qtype in (Q4_K, Q5_K) else 0
    layer = repacked_layer(weight)
    assert layer is None or layer.step_bytes == stored + extra


@pytest.mark.parametrize("qtype", [Q2_K, Q3_K], ids=lambda v: TYPE_NAMES[v])
def test_the_types_not_repacked_keep_their_blocks(qtype):
    weight, _ = block_weight(16, 256, qtype)
    layer = GGUFLinear(weight)
    assert layer.repacked == [None] and layer.blocks[0] is weight.blocks
    x = torch.randn(2, 256)
    torch.testing.assert_close(layer(x), emulate_kernel(x, weight), rtol=1e-5, atol=1e-3)


def test_bias_and_residual_are_added_by_columns_with_strided_rows():
    weight, _ = block_weight(37, 96, Q5_0)
    bias, wide = torch.randn(37), torch.randn(12, 200)
    residual = torch.randn(12, 80)[:, 3:40]  # rows strided by 80
    layer = repacked_layer(weight, bias)
    if layer is None:
        return
    expected = emulate_kernel(wide[:, :96].contiguous(), weight) + bias + residual
    torch.testing.assert_close(layer(wide[:, :96], residual=residual), expected, rtol=1e-5,
                               atol=1e-4)


def identity_q8_0(k: int) -> BlockWeight:
    """Q8_0 blocks of the k x k identity: column j's block holding j has q = 1 there, d = 1."""
    block = np.dtype([("d", "<f2"), ("qs", "i1", BLOCK)])
    raw = np.zeros((k, k // BLOCK), dtype=block)
    raw["d"] = 1.0
    raw["qs"][np.arange(k), np.arange(k) // BLOCK, np.arange(k) % BLOCK] = 1
    return BlockWeight(Q8_0, torch.from_numpy(raw.view(np.uint8).reshape(k, -1).copy()))


@pytest.mark.parametrize("rows", [1, 9, 70])
def test_activations_are_quantized_as_the_reference_bit_for_bit(rows):
    """Through the identity, output j is x's int8 value j times its block's scale, exactly
    (d = 1, every other term 0): the vectorized quantization equals quantize_blocks' fp32
    operations, ties at .5 rounded to even (a block whose max is 127, so x * 127 / max is x)."""
    k = 128
    layer = repacked_layer(identity_q8_0(k))
    if layer is None:
        return
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)) * 3
    x[0, :BLOCK] = torch.arange(BLOCK) - 15.5  # halves: 2.5 -> 2, -3.5 -> -4
    x[0, 0] = 127.0
    x[-1, BLOCK:2 * BLOCK] = 0  # an all-zero block: scale 1, q 0
    xq, scales = quantize_blocks(x)
    expected = xq.float() * scales.repeat_interleave(BLOCK, dim=1)
    assert torch.equal(layer(x), expected)


# A gate/up linear's [gate | up] rows: three panels each (pairs of the gate's and the up's
# panel j, no pair of neighbours), and Qwen2.5-0.5B's (4,864 each, Q5_0 at K = 896)
GATE_UP = [(Q5_0, 96, 896), (Q8_0, 96, 64), (Q4_K, 96, 512), (Q6_K, 96, 512),
           (Q5_0, 9728, 896)]


@pytest.mark.parametrize("qtype,n,k", GATE_UP, ids=lambda v: TYPE_NAMES.get(v, str(v)))
@pytest.mark.parametrize("rows", [1, 7, 9, 70])
def test_silu_and_mul_in_the_epilogue_equals_the_linear_then_silu_and_mul(qtype, n, k, rows):
    """Bit for bit, at every tile shape (decode rows, past 6, past a task of 64); with
    AVX-512 VNNI the fused pass runs (fuses_silu), elsewhere the fallback. Fails if a tile
    pairs the wrong panels (neighbours, not gate j with up j)."""
    weight, _ = block_weight(n, k, qtype, seed=k)
    layer = repacked_layer(weight)
    if layer is None:
        return
    assert layer.fuses_silu == library.gguf_repacked_silu_mul_supported()
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    fused = layer.silu_and_mul(x)
    assert fused.shape == (rows, n // 2)
    # Q6_K's random blocks make infinities: NaN where the product has them
    torch.testing.assert_close(fused, fused_ops.silu_and_mul(layer(x)), rtol=0, atol=0,
                               equal_nan=True)


def test_a_bias_or_panels_split_by_the_halves_take_the_unfused_way():
    """A bias (the epilogue adds none) or a half of 40 columns (its panels would hold both
    gate and up columns): the linear, then silu_and_mul."""
    weight, _ = block_weight(96, 64, Q5_0)
    with_bias = repacked_layer(weight, torch.randn(96))
    odd, _ = block_weight(80, 64, Q5_0)
    split = repacked_layer(odd)
    if with_bias is None:
        return
    assert not with_bias.fuses_silu and not split.fuses_silu
    x = torch.randn(5, 64)
    for layer in (with_bias, split):
        assert torch.equal(layer.silu_and_mul(x), fused_ops.silu_and_mul(layer(x)))
    with pytest.raises(ValueError, match="does not run fused"):
        gguf_ops.gguf_repacked_silu_mul(x, split.repacked[0], Q5_0, 80)
