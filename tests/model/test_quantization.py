"""quantization="int8" (W8A8): the C kernel (the variant this machine's library runs)
against its torch reference, on tiny shapes and SmolLM2-135M's, the quantized product
against the fp32 one, and the whole engine against the fp32 engine on real weights
(stories260K), with the tolerances stated here. Plus the flag's validation. Every variant
this machine can run, compiled on its own: test_int8_gemm_variants.py; SmolLM2's
perplexity: test_int8_real_model.py."""

import argparse
import math

import pytest
import torch
import torch.nn.functional as F

from minivllm import LLM, SamplingParams
from minivllm.config import EngineConfig
from minivllm.entrypoints.engine_args import add_engine_args, config_from_args
from minivllm.model.kernels import library, linear_ops
from minivllm.model.linear.int8 import (
    GROUP,
    WGROUP,
    Int8Linear,
    pack_scales,
    pack_weight,
    quantize_per_group,
    quantize_weight,
    reference_amx_linear,
)
from tests.kernel_marks import needs_kernels


def _case(rows, n, k, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=gen) * 0.05, torch.randn(n, generator=gen),
            torch.randn(rows, k, generator=gen), torch.randn(rows, n, generator=gen))


# SmolLM2-135M's linears: qkv, o, gate_up, down, the LM head (hidden 576, intermediate
# 1536, vocabulary 49152).
SMOLLM2_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]


def kernel_reference(reference: Int8Linear, x: torch.Tensor,
                     residual: torch.Tensor | None = None) -> torch.Tensor:
    """What the kernel computes: the AMX path's from AMX_MIN_ROWS rows where the library runs
    it (amx_gemm.c), else W8A8's (the reference Int8Linear)."""
    if x.shape[0] >= linear_ops.AMX_MIN_ROWS and library.amx():
        y = reference_amx_linear(x, reference.qweight, reference.scales) + reference.bias
        return y if residual is None else residual + y
    return reference(x, residual)


@needs_kernels
@pytest.mark.parametrize("rows, n, k", [(2, 8, 32), (5, 37, 100), (64, 96, 1536), (3, 5, 7),
                                        (97, 24, 2048), (100, 13, 64), (11, 17, 33)]
                         + [(rows, n, k) for n, k in SMOLLM2_SHAPES for rows in (1, 9)]
                         + [(64, 3072, 576), (100, 576, 1536)])
def test_kernel_matches_torch_reference(rows, n, k):
    """Odd K (zero-padded groups), N not a multiple of the panel width (16), every row
    count of a tile's tail (tiles of 3 or 8 rows by variant), more rows than a row block
    (96), and SmolLM2's shapes."""
    weight, bias, x, residual = _case(rows, n, k)
    fast, reference = Int8Linear(weight, bias), Int8Linear(weight, bias, use_kernel=False)
    assert fast.use_kernel and not reference.use_kernel
    # Each group's integer product agrees exactly; the scaling and adds may round
    # differently (the C compiler fuses them into FMAs). One quantization step off
    # anywhere would be ~1e-3 (a weight step times an x value). On AMX tiles the bf16
    # products are exact and only the fp32 sums' order differs.
    tol = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast(x), kernel_reference(reference, x), **tol)
    torch.testing.assert_close(fast(x, residual), kernel_reference(reference, x, residual),
                               **tol)
    strided = torch.randn(rows, 2 * k)[:, ::2]  # rows as a non-contiguous view
    torch.testing.assert_close(fast(strided), kernel_reference(reference, strided), **tol)


@needs_kernels
@pytest.mark.parametrize("rows, n, k", [(32, 16, 32), (33, 37, 100), (64, 3072, 576),
                                        (70, 49152, 576), (40, 576, 1536)])
def test_amx_path_runs_from_its_row_count(rows, n, k):
    """From AMX_MIN_ROWS rows, amx_gemm.c: bf16 activations, so not W8A8's results; every
    row tail of a 32-row block, an odd panel count (37 columns: 3 panels, the last paired
    with itself) and zero-padded K; one row fewer runs W8A8 again."""
    if not library.amx():
        pytest.skip("the kernels run no AMX here (no amx_bf16, or MINIVLLM_ISA forced a "
                    "lower level)")
    weight, bias, x, residual = _case(rows, n, k)
    x[1] = 0
    x[2, :5] = 1e6  # far beyond int8's range of the other values: bf16 keeps them all
    fast, reference = Int8Linear(weight, bias), Int8Linear(weight, bias, use_kernel=False)
    y = fast(x, residual)
    torch.testing.assert_close(y, kernel_reference(reference, x, residual), rtol=1e-5,
                               atol=1e-5 * y.abs().max().item())
    assert not torch.allclose(y, reference(x, residual), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(y[1], residual[1] + bias)
    below = x[:linear_ops.AMX_MIN_ROWS - 1]
    torch.testing.assert_close(fast(below), reference(below), rtol=1e-5, atol=1e-5)


@needs_kernels
def test_kernel_zero_rows_and_extremes():
    weight, bias, x, _ = _case(4, 12, 64)
    x[1] = 0  # scale 1, all-zero row: just the bias
    x[2] = 1e6 * torch.sign(x[2])  # every value at +-127 after quantization
    weight[3] = 0
    fast, reference = Int8Linear(weight, bias), Int8Linear(weight, bias, use_kernel=False)
    torch.testing.assert_close(fast(x)[1], bias)
    torch.testing.assert_close(fast(x), reference(x), rtol=1e-5, atol=1e-5)
    exact = F.linear(x, weight, bias)
    torch.testing.assert_close(fast(x)[2], exact[2], rtol=1e-2, atol=5e-2 * exact[2].abs().max())


@pytest.mark.parametrize("use_kernel", [True, False])
def test_w8a8_close_to_fp32_product(use_kernel):
    """8-bit weights and activations, each with its group scales: the error of a 576-long
    dot product stays within 1.5% of the output's largest value (0.6% measured; per-channel
    7-bit weights with per-token activations: 1.1%)."""
    if use_kernel and not library.available(torch.device("cpu"), torch.float32):
        pytest.skip("no kernels built")
    weight, bias, x, _ = _case(16, 256, 576)
    exact = F.linear(x, weight, bias)
    error = (Int8Linear(weight, bias, use_kernel=use_kernel)(x) - exact).abs().max()
    assert error <= 0.015 * exact.abs().max()


def test_amx_reference_close_to_fp32_product():
    """int8 weights (group scales) times bf16 activations: within 1% of the fp32 product's
    largest value (the weights' error alone: bf16's rounding of x is finer than int8's)."""
    weight, bias, x, _ = _case(64, 256, 576)
    exact = F.linear(x, weight)
    q, scales = quantize_weight(weight)
    error = (reference_amx_linear(x, q, scales) - exact).abs().max()
    assert error <= 0.01 * exact.abs().max()


def test_weights_use_eight_bits_packed_unsigned():
    """Weights in [-127, 127] (all 8 bits: the 7-bit range cost SmolLM2 +1.2% perplexity),
    one scale per output channel and group of 32 inputs, each weight within half a step;
    packed as q + 128 (VNNI's unsigned operand) in panels of 16 columns x 4 input values,
    padding q = 0 (128); the scales in panels of 16 columns per group."""
    assert WGROUP == 32
    weight = torch.randn(20, 40, generator=torch.Generator().manual_seed(0))
    weight = weight * torch.arange(1, 21)[:, None]
    weight[2, 32:] *= 100  # a group of large weights: the row's other group keeps its step
    q, scales = quantize_weight(weight)
    assert q.dtype == torch.int8 and q.shape == (20, 40) and scales.shape == (20, 2)
    assert q.abs().max() == 127 and q.min() == -127
    assert (q[:, :32].abs().amax(dim=1) == 127).all() and (q[:, 32:].abs().amax(dim=1) == 127).all()
    assert scales[2, 1] > 50 * scales[2, 0]
    step = scales.repeat_interleave(WGROUP, dim=1)[:, :40]
    assert ((q.float() * step - weight).abs() <= step / 2 + 1e-5).all()
    packed = pack_weight(q)  # [2 panels of 16 columns, 64 / 4 quads, 16, 4]
    assert packed.dtype == torch.uint8 and packed.shape == (2, 16, 16, 4)
    assert packed[0, 0, 3].tolist() == (q[3, :4].int() + 128).tolist()
    assert packed[1, 9, 3, 2].item() == q[19, 38].item() + 128
    assert packed[1, :, 4:].eq(128).all() and packed[:, 10:].eq(128).all()
    assert packed.min() >= 1  # q = -127 -> 1: no byte is 0 but q = -128, never produced
    packed_scales = pack_scales(scales)  # [2 panels, 2 groups, 16 columns]
    assert packed_scales.shape == (2, 2, 16)
    assert packed_scales[1, 1, 3].item() == scales[19, 1].item()
    assert packed_scales[1, :, 4:].eq(0).all()


def test_per_group_quantization_round_trips():
    """Each group of 32 values of a row its own scale: a group of small values keeps its
    precision beside a group holding an outlier (which one per-token scale would not). K is
    padded with zeros to a multiple of 32, as the kernel's rows."""
    assert GROUP == 32
    x = torch.randn(6, 70, generator=torch.Generator().manual_seed(0)) * torch.arange(1, 7)[:, None]
    x[:, 5] = 1000.0  # an outlier channel in the first group
    q, scales = quantize_per_group(x)
    assert q.shape == (6, 96) and scales.shape == (6, 3) and q[:, 70:].eq(0).all()
    assert q.dtype == torch.int8 and q.abs().max() == 127
    assert (q.abs().view(6, 3, GROUP).amax(dim=2) == 127).all()
    step = scales.repeat_interleave(GROUP, dim=1)[:, :70]
    assert ((q[:, :70].float() * step - x).abs() <= step / 2 + 1e-5).all()
    assert (scales[:, 1:] < scales[:, :1] / 20).all()
    zero = quantize_per_group(torch.zeros(1, 32))[1]
    assert (zero == 1).all()  # an all-zero group's scale


def _greedy(llm, prompts, max_tokens):
    """Greedy continuations, EOS ignored."""
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _scores(llm, sequences):
    """The logprob of each token after the first, teacher-forced (prompt_logprobs)."""
    params = SamplingParams(max_tokens=1, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": s} for s in sequences], params, use_tqdm=False)
    return [[entry[t].logprob for entry, t in zip(o.prompt_logprobs[1:], o.prompt_token_ids[1:])]
            for o in outs]


def test_engine_int8_against_fp32_on_stories(stories_dir):
    """16 prompts x 32 greedy tokens on real weights. Stated tolerances (measured here with
    the current scheme: 0.023, -0.02%, 71%; with the earlier 7-bit weights and per-token
    scales: 0.043, +1.5%, 45%): the fp32 greedy tokens' mean |dlogprob| below 0.05, their
    teacher-forced perplexity within 2% of fp32's, and on average at least 40% of each
    continuation identical to fp32's before the first difference."""
    prompts = [[1] + [(7 * i + 13 * j) % 480 + 20 for j in range(3 + i % 5)] for i in range(16)]
    kwargs = dict(seed=0, kv_cache_space=0.05, swap_space=0.01)
    fp32 = LLM(str(stories_dir), dtype="float32", **kwargs)
    reference = _greedy(fp32, prompts, 32)
    sequences = [p + t for p, t in zip(prompts, reference)]
    base = _scores(fp32, sequences)
    int8 = LLM(str(stories_dir), quantization="int8", **kwargs)
    tokens = _greedy(int8, prompts, 32)
    scores = _scores(int8, sequences)
    deltas = [abs(a - b) for s, r in zip(scores, base) for a, b in zip(s[-32:], r[-32:])]
    assert sum(deltas) / len(deltas) < 0.05
    nll = lambda rows: -sum(map(sum, rows)) / sum(map(len, rows))  # noqa: E731
    assert abs(math.exp(nll(scores)) / math.exp(nll(base)) - 1) < 0.02
    prefixes = [next((i for i, (a, b) in enumerate(zip(t, r)) if a != b), 32)
                for t, r in zip(tokens, reference)]
    assert sum(prefixes) / (32 * len(prefixes)) >= 0.4


def test_quantization_flag_and_its_errors():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert config_from_args(parser.parse_args(["--quantization", "int8"])).quantization == "int8"
    assert config_from_args(parser.parse_args(["--quantization", "none"])).quantization == "none"
    with pytest.raises(ValueError, match=r"quantization \(--quantization\) must be none, int8"):
        EngineConfig(quantization="int4")
    with pytest.raises(ValueError, match="dtype must be auto or float32, got 'bfloat16'"):
        EngineConfig(quantization="int8", dtype="bfloat16")
