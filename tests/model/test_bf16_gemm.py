"""bf16-stored weights with fp32 arithmetic (bf16_gemm.c, linear_bf16.py; AVX-512 and AVX2
variants, test_kernel_isa.py runs this file at every level): fp32 x times the weights
rounded to bf16, in fp32, at every row count — a decode row, a verify step's, a prompt's,
across the kernel's tiles and tasks of 64 rows — on tiny shapes, column counts off the
panel, K of any size, and SmolLM2's and Qwen2.5-0.5B's shapes; a row's result bit for bit
the same alone or in any batch and at any thread count; the bytes half fp32's."""

from __future__ import annotations

import pytest
import torch

from minivllm.model.kernels import cpu
from minivllm.model.kernels.linear_bf16 import Bf16Linear, pack_weight, reference_linear
from tests.kernel_marks import needs_kernels

pytestmark = needs_kernels


def bf16_layer(weight, bias=None) -> Bf16Linear | None:
    """The layer over `weight`, or None below AVX2 (no kernel: bf16_linear refuses).
    Asked at each test, not skipped: test_kernel_isa.py runs this file under every
    level's library, each level all tests."""
    if not cpu.bf16_panel_width():
        with pytest.raises(RuntimeError, match="below AVX2"):
            cpu.bf16_linear(torch.zeros(1, 32), torch.zeros(32, 32, dtype=torch.bfloat16),
                            None, None, 32)
        return None
    return Bf16Linear(weight, bias)


# tiny; N off the panels of 16 / 32 (a last panel of 5 and of 20 columns) and K odd;
# SmolLM2-135M's qkv / down; Qwen2.5-0.5B's qkv, gate+up and down
SHAPES = [(16, 32), (37, 33), (52, 7), (960, 576), (576, 1536), (1152, 896), (9728, 896),
          (896, 4864)]


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("rows", [1, 6, 9, 70])
def test_bf16_weights_times_fp32_x_in_fp32(n, k, rows):
    gen = torch.Generator().manual_seed(n * k + rows)
    weight, x = torch.randn(n, k, generator=gen), torch.randn(rows, k, generator=gen)
    layer = bf16_layer(weight)
    if layer is None:
        return
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (rows, n)
    # fp32 sums in another order: |error| ~ sqrt(k) ulps of the terms
    torch.testing.assert_close(y, reference_linear(x, weight), rtol=1e-5, atol=2e-5 * k**0.5)


@pytest.mark.parametrize("n,k", [(37, 33), (1152, 896)])
def test_a_rows_result_does_not_depend_on_its_batch_or_threads(n, k):
    gen = torch.Generator().manual_seed(k)
    weight, bias = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    x, residual = torch.randn(70, k, generator=gen), torch.randn(70, n, generator=gen)
    layer = bf16_layer(weight, bias)
    if layer is None:
        return
    alone = torch.cat([layer(x[i:i + 1], residual=residual[i:i + 1]) for i in range(70)])
    for rows in (3, 8, 9, 64, 70):  # tiles of 6 / 8 rows, tasks of 64
        batch = layer(x[:rows], residual=residual[:rows])
        assert torch.equal(batch, alone[:rows]), rows
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(layer(x, residual=residual), alone)
    finally:
        torch.set_num_threads(threads)


def test_bias_and_residual_are_added_by_columns_with_strided_rows():
    gen = torch.Generator().manual_seed(5)
    weight, bias = torch.randn(37, 96, generator=gen), torch.randn(37, generator=gen)
    wide = torch.randn(12, 200, generator=gen)
    residual = torch.randn(12, 80, generator=gen)[:, 3:40]  # rows strided by 80
    layer = bf16_layer(weight, bias)
    if layer is None:
        return
    expected = reference_linear(wide[:, :96], weight) + bias + residual
    torch.testing.assert_close(layer(wide[:, :96], residual=residual), expected, rtol=1e-5,
                               atol=1e-4)


def test_the_weights_are_stored_in_half_fp32s_bytes():
    weight = torch.randn(1152, 896)
    layer = bf16_layer(weight)
    if layer is None:
        return
    assert layer.packed.dtype == torch.bfloat16
    assert layer.packed.numel() == 1152 * 896  # 1152 is a whole number of panels
    # column c, k lives in panel c // P at word c % (P/2), half c // (P/2) % 2
    panel = cpu.bf16_panel_width()
    packed = pack_weight(weight, panel)
    c, k = panel + panel // 2 + 3, 17
    assert packed[1, k, 3, 1] == weight[c, k].bfloat16()
