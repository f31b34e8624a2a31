"""GGUF Q8_0 / Q4_0 / Q4_1 / Q4_K blocks as stored (minivllm/model/kernels/linear_gguf.py, gguf_gemm.c):
the torch dequantization equals the gguf package's, and the C kernel equals the torch
emulation of what it computes (int8 activation blocks x the weight blocks' integers) and
stays close to the reference (dequantized weights, F.linear), on tiny shapes and SmolLM2's.
test_kernel_isa.py runs the kernel tests once per ISA level of this CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from minivllm.model.kernels import cpu
from minivllm.model.kernels.linear_gguf import (
    Q4_0,
    Q4_1,
    Q4_K,
    Q8_0,
    BlockWeight,
    GGUFLinear,
    cat_rows,
    emulate_amx,
    emulate_kernel,
)
from tests.kernel_marks import needs_kernels
from tests.model.q4_k_blocks import quantize_q4_k

TYPES = [Q8_0, Q4_0, Q4_1, Q4_K]


def block_weight(n: int, k: int, qtype: int, seed: int = 0) -> tuple[BlockWeight, np.ndarray]:
    """Random weights [n, k] quantized by the gguf package (Q4_K: by q4_k_blocks), and the
    gguf package's dequantization of them."""
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.05
    w[0, :32] = 0  # an all-zero block: scale 0
    w[-1, -64:] += 0.3  # Q4_K: a block of 32 with a minimum of 0 (all values positive)
    raw = quantize_q4_k(w) if qtype == Q4_K else quantize(w, GGMLQuantizationType(qtype))
    return (BlockWeight(qtype, torch.from_numpy(raw.copy())),
            dequantize(raw, GGMLQuantizationType(qtype)))


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_equals_gguf_package(qtype):
    weight, expected = block_weight(40, 512, qtype)
    assert weight.shape == (40, 512)
    assert torch.equal(weight.dequantize(), torch.from_numpy(expected))


def test_cat_rows_keeps_blocks_of_one_type_and_dequantizes_a_mix():
    a, a_ref = block_weight(8, 64, Q8_0, 1)
    b, b_ref = block_weight(4, 64, Q8_0, 2)
    c, c_ref = block_weight(4, 64, Q4_0, 3)
    same = cat_rows([a, b])
    assert isinstance(same, BlockWeight) and same.shape == (12, 64)
    assert torch.equal(same.dequantize(), torch.from_numpy(np.concatenate([a_ref, b_ref])))
    mixed = cat_rows([a, c])
    assert torch.equal(mixed, torch.from_numpy(np.concatenate([a_ref, c_ref])))


@pytest.mark.parametrize("qtype", TYPES)
def test_reference_linear_is_f_linear_of_the_dequantized_blocks(qtype):
    weight, expected = block_weight(24, 256, qtype)
    x, bias, residual = torch.randn(3, 256), torch.randn(24), torch.randn(3, 24)
    layer = GGUFLinear(weight, bias, use_kernel=False)
    want = residual + F.linear(x, torch.from_numpy(expected), bias)
    assert torch.equal(layer(x, residual=residual), want)


SHAPES = [(16, 32), (40, 96), (576, 576), (1536, 576), (576, 1536), (49152, 576)]
# Q4_K's super-blocks need K a multiple of 256 (llama.cpp stores SmolLM2's K = 576 linears
# in another type): SmolLM2's down_proj, and Llama-sized ones
Q4_K_SHAPES = [(16, 256), (40, 512), (576, 1536), (2048, 2048)]
CASES = [(qtype, n, k) for qtype in TYPES if qtype != Q4_K for n, k in SHAPES] + [
    (Q4_K, n, k) for n, k in Q4_K_SHAPES]


def emulated(x: torch.Tensor, weight: BlockWeight) -> torch.Tensor:
    """What the kernels compute: amx_gemm.c's from AMX_MIN_ROWS rows where the library runs
    it, else gguf_gemm.c's."""
    if x.shape[0] >= cpu.AMX_MIN_ROWS and cpu.amx():
        return emulate_amx(x, weight)
    return emulate_kernel(x, weight)


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
    # Against the dequantized weights in fp32: the activations' int8 error, about 1%; up to
    # 3% where the outlier row is the only one and K one block (its 29 other values then
    # round to steps of 40 / 127).
    reference = F.linear(x, torch.from_numpy(dequantized))
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
    torch.testing.assert_close(layer(x, residual=residual),
                               residual + emulated(x.contiguous(), weight) + bias,
                               rtol=1e-5, atol=1e-5)
    assert torch.equal(layer(torch.zeros(rows, 256)), bias.expand(rows, 48))


@needs_kernels
@pytest.mark.parametrize("qtype", TYPES)
def test_amx_path_runs_from_its_row_count(qtype):
    """From AMX_MIN_ROWS rows, amx_gemm.c: bf16 activations, so not the int8 kernel's
    results; 40 columns (the last panel paired with itself, 8 of its columns past n); one
    row fewer runs gguf_gemm.c again."""
    if not cpu.amx():
        pytest.skip("the kernels run no AMX here (no amx_bf16, or MINIVLLM_ISA forced a "
                    "lower level)")
    weight, _ = block_weight(40, 256, qtype)
    x = torch.randn(cpu.AMX_MIN_ROWS, 256)
    y = GGUFLinear(weight)(x)
    torch.testing.assert_close(y, emulate_amx(x, weight), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(y, emulate_kernel(x, weight), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(GGUFLinear(weight)(x[1:]), emulate_kernel(x[1:], weight),
                               rtol=1e-5, atol=1e-5)


@needs_kernels
def test_kernel_refuses_another_block_type_q4_1_without_minima_and_q4_k_off_256():
    with pytest.raises(ValueError, match="not Q8_0 / Q4_0 / Q4_1"):  # Q5_0
        cpu.gguf_linear(torch.randn(1, 32), torch.zeros(1, 22, dtype=torch.uint8),
                        torch.ones(1, 1), None, 6, None, None, 1)
    with pytest.raises(ValueError, match="with their minima"):
        cpu.gguf_linear(torch.randn(1, 32), torch.zeros(1, 20, dtype=torch.uint8),
                        torch.ones(1, 1), None, Q4_1, None, None, 1)
    with pytest.raises(ValueError, match="super-blocks of 256"):  # Q4_K, K = 32
        cpu.gguf_linear(torch.randn(1, 32), torch.zeros(1, 144, dtype=torch.uint8),
                        torch.ones(1, 1), torch.ones(1, 1), Q4_K, None, None, 1)
