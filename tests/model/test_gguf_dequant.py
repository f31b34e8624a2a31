"""The prefill route of GGUF linears on CPUs without AMX (gguf_dequant.c, gguf_ops.gguf_linear):
panels of output rows dequantized to fp32 bit for bit as the gguf package does, on tiny
shapes and Qwen2.5-0.5B's (random bytes: every bit pattern of every field), then sgemm into
the panel's columns of y; from gguf_ops.GGUF_DEQUANT_MIN_ROWS rows on, the int8 kernel below, and
amx_gemm.c first where it runs (on a CPU below AVX2, and on every CPU for the types
gguf_repacked.c does not hold). test_kernel_isa.py runs this file once per ISA
level of this CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from minivllm.model.kernels import gguf_ops, library, linear_ops
from minivllm.model.kernels.gguf_blocks import K_TYPES, TYPE_NAMES, UNIT_BYTES
from minivllm.model.linear.gguf import BlockWeight, GGUFLinear, emulate_kernel
from tests.kernel_marks import needs_kernels
from tests.model.test_gguf_kernel import block_weight, random_blocks

pytestmark = needs_kernels
TYPES = list(TYPE_NAMES)


@pytest.fixture(autouse=True)
def blocks_as_stored(monkeypatch):
    """The route of a CPU below AVX2: no weights repacked (test_gguf_repacked.py
    tests that route)."""
    monkeypatch.setattr(library, "gguf_repacked", lambda: False)


def bits(t: torch.Tensor) -> torch.Tensor:
    """fp32 as its bit patterns: a -0.0 differs from 0.0 here, as it does not for equal."""
    return t.contiguous().view(torch.int32)


def real_shape(qtype: int) -> tuple[int, int]:
    """Qwen2.5-0.5B's gate / up (4864 x 896) for the blocks of 32; its down (896 x 4864)
    for the K types' super-blocks of 256."""
    return (896, 4864) if qtype in K_TYPES else (4864, 896)


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_is_the_gguf_package_bit_for_bit(qtype):
    for n, k in [(3, 256), (40, 512), real_shape(qtype)]:
        raw = random_blocks(n, k, qtype, seed=n)
        got = gguf_ops.gguf_dequantize(torch.from_numpy(raw), qtype, k)
        expected = torch.from_numpy(dequantize(raw, GGMLQuantizationType(qtype)))
        assert torch.equal(bits(got), bits(expected)), (n, k)
        # BlockWeight.dequantize: the same values (zeros may carry the other sign)
        assert torch.equal(got, BlockWeight(qtype, torch.from_numpy(raw)).dequantize())
    weight, expected = block_weight(40, 512, qtype)  # quantized weights, zero blocks among them
    assert torch.equal(bits(gguf_ops.gguf_dequantize(weight.blocks, qtype, 512)),
                       bits(torch.from_numpy(expected)))


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_writes_rows_asked_for_into_the_buffer_given(qtype):
    raw = random_blocks(40, 256, qtype, seed=2)
    expected = torch.from_numpy(dequantize(raw, GGMLQuantizationType(qtype)))
    buffer = torch.full((20 * 256 + 7,), float("nan"))
    got = gguf_ops.gguf_dequantize(torch.from_numpy(raw), qtype, 256, 13, 30, out=buffer)
    assert got.data_ptr() == buffer.data_ptr() and got.shape == (17, 256)
    assert torch.equal(bits(got), bits(expected[13:30]))
    assert buffer[17 * 256:].isnan().all()  # nothing past the rows asked for


def test_dequantize_refuses_another_type_and_a_k_type_off_256():
    with pytest.raises(ValueError, match="not a block type the kernel reads"):  # F16
        gguf_ops.gguf_dequantize(torch.zeros(1, 64, dtype=torch.uint8), 1, 32)
    for qtype in K_TYPES:
        with pytest.raises(ValueError, match="super-blocks of 256"):
            gguf_ops.gguf_dequantize(torch.zeros(1, UNIT_BYTES[qtype], dtype=torch.uint8), qtype,
                                     32)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("with_bias,with_residual", [(False, False), (True, False),
                                                     (False, True), (True, True)])
def test_panels_are_f_linear_of_the_dequantized_weights(qtype, with_bias, with_residual,
                                                        monkeypatch):
    """Panels of 7 rows over 40 (the last one 5), x and residual with strided rows."""
    k = 256
    monkeypatch.setattr(gguf_ops, "GGUF_PANEL_BYTES", 7 * 4 * k)
    weight, dequantized = block_weight(40, k, qtype)
    rows = gguf_ops.GGUF_DEQUANT_MIN_ROWS
    x = torch.randn(rows, 2 * k)[:, :k]
    bias = torch.randn(40) if with_bias else None
    residual = torch.randn(rows, 80)[:, 3:43] if with_residual else None
    y = GGUFLinear(weight, bias)(x, residual=residual)
    expected = F.linear(x, torch.from_numpy(dequantized), bias)
    if residual is not None:
        expected = expected + residual
    scale = F.linear(x.abs(), torch.from_numpy(dequantized).abs()).max().item()
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("qtype", TYPES)
def test_panels_at_a_real_shape_with_a_panel_that_does_not_divide_it(qtype, monkeypatch):
    n, k = real_shape(qtype)
    monkeypatch.setattr(gguf_ops, "GGUF_PANEL_BYTES", 1000 * 4 * k)  # 1000 rows a panel
    raw = random_blocks(n, k, qtype, seed=3)
    weight = BlockWeight(qtype, torch.from_numpy(raw))
    x, bias = torch.randn(40, k), torch.randn(n)
    w = torch.from_numpy(dequantize(raw, GGMLQuantizationType(qtype)))
    y = GGUFLinear(weight, bias)(x)
    scale = F.linear(x.abs(), w.abs()).max().item()
    torch.testing.assert_close(y, F.linear(x, w, bias), rtol=1e-5, atol=1e-5 * scale)


class Recording:
    """The library, recording which GGUF kernels a call reached."""

    def __init__(self, library, amx_status: int) -> None:
        self.library, self.amx_status, self.called = library, amx_status, []

    def __getattr__(self, name):
        function = getattr(self.library, name)
        if name in ("gguf_linear_f32", "gguf_dequantize_f32"):
            self.called.append(name)
        return function

    def gguf_linear_amx_f32(self, **kwargs):
        self.called.append("gguf_linear_amx_f32")
        return self.amx_status


@pytest.mark.parametrize("qtype", TYPES)
def test_rows_below_the_threshold_run_the_int8_kernel_and_from_it_panels(qtype, monkeypatch):
    recording = Recording(library._library(), -1)
    monkeypatch.setattr(library, "_library", lambda: recording)
    monkeypatch.setattr(library, "amx", lambda: False)
    weight, dequantized = block_weight(16, 256, qtype)
    below = torch.randn(gguf_ops.GGUF_DEQUANT_MIN_ROWS - 1, 256)
    torch.testing.assert_close(GGUFLinear(weight)(below), emulate_kernel(below, weight),
                               rtol=1e-5, atol=1e-4)
    assert recording.called == ["gguf_linear_f32"]
    recording.called.clear()
    at = torch.randn(gguf_ops.GGUF_DEQUANT_MIN_ROWS, 256)
    y = GGUFLinear(weight)(at)
    torch.testing.assert_close(y, F.linear(at, torch.from_numpy(dequantized)), rtol=1e-5,
                               atol=1e-4)
    assert recording.called == ["gguf_dequantize_f32"]


@pytest.mark.parametrize("amx_status,route", [(0, "gguf_linear_amx_f32"),
                                              (-1, "gguf_dequantize_f32")])
def test_amx_keeps_priority_for_its_types(amx_status, route, monkeypatch):
    """On a CPU with AMX (pretended), a prefill of GGUF_AMX_TYPES asks amx_gemm.c first and
    runs panels only if it refuses; the other types go to panels directly."""
    recording = Recording(library._library(), amx_status)
    monkeypatch.setattr(library, "_library", lambda: recording)
    monkeypatch.setattr(library, "amx", lambda: True)
    x = torch.randn(max(linear_ops.AMX_MIN_ROWS, gguf_ops.GGUF_DEQUANT_MIN_ROWS), 256)
    for qtype in TYPES:
        recording.called.clear()
        GGUFLinear(block_weight(16, 256, qtype)[0])(x)
        if qtype in gguf_ops.GGUF_AMX_TYPES:
            assert recording.called[-1] == route
            assert recording.called[0] == "gguf_linear_amx_f32"
        else:
            assert recording.called == ["gguf_dequantize_f32"]
