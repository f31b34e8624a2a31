"""bf16 linears on AMX tiles (linear/amx.py, amx_gemm.c's bf16_linear_amx_f32): the
packing into B tiles, and the kernel against its definition (x and the weights rounded to
bf16, exact products accumulated in fp32, fp32 out) on tiny odd shapes and SmolLM2's, one
row to many. The kernel tests run where the CPU has AMX-BF16 (skipped elsewhere, saying
so)."""

from __future__ import annotations

import pytest
import torch

from minivllm.model.kernels import library
from minivllm.model.linear.amx import AmxBf16Linear, pack_weight, reference_linear
from tests.kernel_marks import needs_kernels


def test_packing_puts_each_pair_of_k_of_16_columns_in_a_tile_row():
    weight = (torch.arange(20 * 40) % 251).float().view(20, 40)  # exact in bf16
    packed = pack_weight(weight)  # 2 panels, K padded to 64: 32 pairs, 16 columns, 2
    assert packed.dtype == torch.bfloat16 and packed.shape == (2, 32, 16, 2)
    assert packed[0, 3, 5].tolist() == [weight[5, 6].item(), weight[5, 7].item()]
    assert packed[1, 19, 3].tolist() == [weight[19, 38].item(), weight[19, 39].item()]
    assert packed[1, :, 4:].eq(0).all() and packed[:, 20:].eq(0).all()  # the padding


@needs_kernels
@pytest.mark.parametrize("rows, n, k", [(1, 16, 32), (5, 37, 100), (33, 96, 80), (64, 24, 2048)]
                         + [(rows, n, k) for n, k in [(960, 576), (3072, 576), (576, 1536),
                                                      (49152, 576)] for rows in (1, 64)])
def test_kernel_matches_its_definition(rows, n, k):
    if not library.amx():
        pytest.skip("no AMX tiles here (no amx_bf16, or MINIVLLM_ISA forced a lower level)")
    gen = torch.Generator().manual_seed(n + k)
    weight, bias = torch.randn(n, k, generator=gen) * 0.05, torch.randn(n, generator=gen)
    x, residual = torch.randn(rows, 2 * k, generator=gen)[:, ::2], torch.randn(rows, n,
                                                                             generator=gen)
    layer = AmxBf16Linear(weight, bias)
    y = layer(x, residual)
    expected = reference_linear(x, weight) + bias + residual
    # Exact bf16 products; only the order of the fp32 sums differs.
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    torch.testing.assert_close(AmxBf16Linear(weight)(x), reference_linear(x, weight),
                               rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    assert layer(x[:0]).shape == (0, n)  # an empty batch (an MoE expert no token chose)
    # fp32 out: not the bf16-rounded product (oneDNN's bf16 output)
    assert not torch.equal(y, (reference_linear(x, weight) + bias).bfloat16().float()
                           + residual)
