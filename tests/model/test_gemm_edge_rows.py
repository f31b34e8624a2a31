"""Issue 50's row edges for every GEMM kernel of ours, at a real shape and an odd one: 1 row
(decode), 15 and 17 (one short of and one past a tile of 16 / two of 8), 513 (one past
eight tasks of 64). K off the block where the format allows it (int8's groups of 32 are
zero-padded, bf16 has no blocks; GGUF's blocks of 32 / 256 are the file's). The other files
test many more shapes at fewer rows; test_kernel_isa.py runs this one at every ISA level."""

from __future__ import annotations

import pytest
import torch

from minivllm.model.kernels.gguf_blocks import Q4_K, Q5_0, Q6_K, Q8_0, TYPE_NAMES
from minivllm.model.linear.gguf import emulate_kernel
from minivllm.model.linear.int8 import Int8Linear
from minivllm.model.linear.panels import reference_linear
from tests.kernel_marks import needs_kernels
from tests.lora import test_lora_layers as lora
from tests.model.test_gguf_kernel import block_weight
from tests.model.test_gguf_repacked import repacked_layer
from tests.model.test_panel_gemm import panel_layer
from tests.model.test_quantization import _case, kernel_reference

pytestmark = needs_kernels
ROWS = [1, 15, 17, 513]


@pytest.mark.parametrize("stored", ["bf16", "fp32", "bf16 pairs"])
@pytest.mark.parametrize("n, k", [(1152, 896), (37, 33)])  # Qwen2.5-0.5B's qkv; odd
@pytest.mark.parametrize("rows", ROWS)
def test_panel_weights(rows, n, k, stored):
    gen = torch.Generator().manual_seed(rows + n)
    weight, x = torch.randn(n, k, generator=gen), torch.randn(rows, k, generator=gen)
    layer = panel_layer(weight, stored=stored)
    if layer is None:  # no kernel here (panel_layer checked that it refuses)
        return
    torch.testing.assert_close(layer(x), reference_linear(x, weight, stored), rtol=1e-5,
                               atol=2e-5 * k ** 0.5)


@pytest.mark.parametrize("n, k", [(960, 576), (37, 100)])  # SmolLM2's qkv; odd K
@pytest.mark.parametrize("rows", ROWS)
def test_int8(rows, n, k):
    weight, bias, x, residual = _case(rows, n, k)
    fast, reference = Int8Linear(weight, bias), Int8Linear(weight, bias, use_kernel=False)
    torch.testing.assert_close(fast(x, residual), kernel_reference(reference, x, residual),
                               rtol=1e-5, atol=1e-5)


# Qwen2.5-Coder-0.5B Q4_K_M's types at its shapes (k / v in Q5_0 / Q8_0, down in Q4_K /
# Q6_K) and a column count off the panels of 16
@pytest.mark.parametrize("qtype, n, k", [(Q5_0, 128, 896), (Q8_0, 37, 896), (Q4_K, 40, 4864),
                                         (Q6_K, 896, 512)],
                         ids=lambda v: TYPE_NAMES.get(v, str(v)))
@pytest.mark.parametrize("rows", ROWS)
def test_gguf_repacked(rows, qtype, n, k):
    weight, _ = block_weight(n, k, qtype, seed=n + k)
    layer = repacked_layer(weight)
    if layer is None:  # below AVX2 (repacked_layer checked that the blocks stay)
        return
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    expected = emulate_kernel(x, weight)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5,
                               atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("shape", [(896, 1152, 3), (100, 37, 3)],
                         ids=lambda s: f"{s[0]}x{s[1]}x{s[2]}")
@pytest.mark.parametrize("weights", [torch.float32, torch.bfloat16])
def test_lora_segments_513_rows(shape, weights):
    """lora_sgmv.c; 1, 15 and 17 rows are in test_lora_layers.py."""
    lora.check_kernel(shape, 513, weights)
