"""Weights packed into panels (panel_gemm.c, linear/panels.py; AVX-512 and AVX2 variants,
test_kernel_isa.py runs this file at every level), stored as bf16 or fp32 (fp32
arithmetic) or as bf16 pairs (bf16 dot products, AVX512-BF16 only; elsewhere the kernel
must refuse them): x (rounded to bf16 for the pairs) times the weights as stored, in fp32,
at every row count — a decode row, a verify
step's, a prompt's, across the kernel's tiles and tasks of 64 rows — on tiny shapes, column
counts off the panel, K of any size, and SmolLM2's and Qwen2.5-0.5B's shapes; a row's result
bit for bit the same alone or in any batch and at any thread count; bf16's bytes half
fp32's, fp32's layout column-major per panel."""

from __future__ import annotations

import pytest
import torch

from minivllm.model.kernels import library, linear_ops
from minivllm.model.linear.panels import PanelLinear, pack_weight, reference_linear
from tests.kernel_marks import needs_kernels

pytestmark = needs_kernels
STORED = ["bf16", "fp32", "bf16 pairs"]


def panel_layer(weight, bias=None, stored="bf16") -> PanelLinear | None:
    """The layer over `weight`, or None where the library has no kernel for `stored` (below
    AVX2; the pairs below AVX512-BF16): panel_linear must refuse them there. Asked at each
    test, not skipped: test_kernel_isa.py runs this file under every level's library, each
    level all tests."""
    if not library.panel_width() or (stored == "bf16 pairs" and not library.panel_bf16_dot()):
        with pytest.raises(RuntimeError, match=f"no panel kernel for {stored} weights"):
            linear_ops.panel_linear(torch.zeros(1, 32), torch.zeros(32, 32, dtype=torch.bfloat16),
                                    stored, None, None, 32)
        return None
    return PanelLinear(weight, bias, stored)


# tiny; N off the panels of 16 / 32 (a last panel of 5 and of 20 columns) and K odd;
# SmolLM2-135M's qkv / down; Qwen2.5-0.5B's qkv, gate+up and down
SHAPES = [(16, 32), (37, 33), (52, 7), (960, 576), (576, 1536), (1152, 896), (9728, 896),
          (896, 4864)]


@pytest.mark.parametrize("stored", STORED, ids=str)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("rows", [1, 6, 9, 70])
def test_stored_weights_times_fp32_x_in_fp32(n, k, rows, stored):
    gen = torch.Generator().manual_seed(n * k + rows)
    weight, x = torch.randn(n, k, generator=gen), torch.randn(rows, k, generator=gen)
    layer = panel_layer(weight, stored=stored)
    if layer is None:
        return
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (rows, n)
    # fp32 sums in another order: |error| ~ sqrt(k) ulps of the terms
    torch.testing.assert_close(y, reference_linear(x, weight, stored), rtol=1e-5,
                               atol=2e-5 * k**0.5)


@pytest.mark.parametrize("stored", STORED, ids=str)
@pytest.mark.parametrize("n,k,rows", [(896, 4864, 97), (576, 1536, 757), (64, 8960, 37)])
def test_row_counts_that_once_left_a_chunk_of_rows_empty(n, k, rows, stored):
    """Rows split into chunks of whole tiles, as many rows as keep their x in L2 (fewer at a
    large K): the chunk count once came from the cap, not from the rounded-up chunk size, so
    the last chunk could hold no rows, and its prefetch share divided by its 0 tiles (SIGFPE
    at Qwen2.5-0.5B's down projection, 97 rows, and SmolLM2's at 757)."""
    gen = torch.Generator().manual_seed(rows)
    weight, x = torch.randn(n, k, generator=gen), torch.randn(rows, k, generator=gen)
    layer = panel_layer(weight, stored=stored)
    if layer is None:
        return
    torch.testing.assert_close(layer(x), reference_linear(x, weight, stored), rtol=1e-5,
                               atol=2e-5 * k**0.5)


@pytest.mark.parametrize("stored", STORED, ids=str)
@pytest.mark.parametrize("n,k", [(37, 33), (1152, 896)])
def test_a_rows_result_does_not_depend_on_its_batch_or_threads(n, k, stored):
    gen = torch.Generator().manual_seed(k)
    weight, bias = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    x, residual = torch.randn(70, k, generator=gen), torch.randn(70, n, generator=gen)
    layer = panel_layer(weight, bias, stored)
    if layer is None:
        return
    alone = torch.cat([layer(x[i:i + 1], residual=residual[i:i + 1]) for i in range(70)])
    for rows in (3, 8, 9, 13, 64, 70):  # tiles of 6 / 12 rows
        batch = layer(x[:rows], residual=residual[:rows])
        assert torch.equal(batch, alone[:rows]), rows
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(layer(x, residual=residual), alone)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("stored", STORED, ids=str)
def test_bias_and_residual_are_added_by_columns_with_strided_rows(stored):
    gen = torch.Generator().manual_seed(5)
    weight, bias = torch.randn(37, 96, generator=gen), torch.randn(37, generator=gen)
    wide = torch.randn(12, 200, generator=gen)
    residual = torch.randn(12, 80, generator=gen)[:, 3:40]  # rows strided by 80
    layer = panel_layer(weight, bias, stored)
    if layer is None:
        return
    expected = reference_linear(wide[:, :96], weight, stored) + bias + residual
    torch.testing.assert_close(layer(wide[:, :96], residual=residual), expected, rtol=1e-5,
                               atol=1e-4)


def test_bf16_weights_are_stored_in_half_fp32s_bytes():
    weight = torch.randn(1152, 896)
    layer = panel_layer(weight)
    if layer is None:
        return
    assert layer.packed.dtype == torch.bfloat16
    assert layer.packed.numel() == 1152 * 896  # 1152 is a whole number of panels
    # column c, k lives in panel c // P at word c % (P/2), half c // (P/2) % 2
    panel = library.panel_width()
    packed = pack_weight(weight, panel, "bf16")
    c, k = panel + panel // 2 + 3, 17
    assert packed[1, k, 3, 1] == weight[c, k].bfloat16()


def test_bf16_pairs_hold_a_columns_two_ks_in_one_word_k_padded_to_even():
    weight = torch.randn(37, 33)
    packed = pack_weight(weight, 32, "bf16 pairs")
    assert packed.shape == (2, 17, 32, 2) and packed.dtype == torch.bfloat16
    assert packed[1, 8, 4, 1] == weight[36, 17].bfloat16()  # column 32 + 4, k 2 * 8 + 1
    assert packed[0, 16, 3, 0] == weight[3, 32].bfloat16()  # the last k ...
    assert packed[0, 16, 3, 1] == 0  # ... and its zero pair
    assert torch.equal(packed[1, :, 5:].float(), torch.zeros(17, 27, 2))  # padding columns


def test_bf16_pairs_round_x_to_bf16_so_its_low_bits_do_not_count():
    weight = torch.randn(48, 64)
    layer = panel_layer(weight, stored="bf16 pairs")
    if layer is None:
        return
    x = torch.randn(3, 64).bfloat16().float()
    nudged = x + x.abs() * 2.0 ** -12  # below half a bf16 ulp: rounds back to x
    assert torch.equal(layer(nudged), layer(x))
    assert not torch.equal(panel_layer(weight, stored="bf16")(nudged), panel_layer(weight)(x))


def test_fp32_weights_are_stored_exactly_a_panels_columns_contiguous_per_k():
    weight = torch.randn(37, 96)
    packed = pack_weight(weight, 16, "fp32")
    assert packed.shape == (3, 96, 16) and packed.dtype == torch.float32
    assert torch.equal(packed[1, 17, 5], weight[21, 17])  # column 16 + 5, k 17
    assert torch.equal(packed[2, :, 5:], torch.zeros(96, 11))  # the padding columns
