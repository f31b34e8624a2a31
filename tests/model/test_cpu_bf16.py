"""bf16 on the CPU: bf16 linear weights and KV cache, fp32 activations between the ops (so the
C kernels run as in fp32). The mixed linear of oneDNN / F.linear against its definition (x
rounded to bf16, the product accumulated in fp32 and rounded to bf16, bias and residual
added in fp32); an engine with dtype="bfloat16" holds the linears this CPU runs best — AMX
tiles, oneDNN's native bf16 and the bf16 dot panels (the LM head on the latter) or, without
AVX512-BF16, bf16-stored weights with fp32 arithmetic (panel_gemm.c, test_panel_gemm.py;
the LM head bf16 too) — and a bf16 KV
cache, runs the kernels, and decodes the same greedy tokens with the kernels on and off;
dtype="auto" picks bf16 where it pays."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minivllm import LLM, SamplingParams
from minivllm.model.kernels import library
from minivllm.model.kernels.isa import native_bf16
from minivllm.model.linear.amx import AmxBf16Linear
from minivllm.model.linear.onednn import Linear
from minivllm.model.linear.panels import PanelLinear


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("onednn", [True, False])
def test_bf16_weights_with_fp32_inputs(rows, onednn):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 80, generator=gen).to(torch.bfloat16)
    bias = torch.randn(96, generator=gen)
    x = torch.randn(rows, 80, generator=gen)
    residual = torch.randn(rows, 96, generator=gen)
    linear = Linear(weight, bias, onednn=onednn)
    expected = F.linear(x.to(torch.bfloat16).float(), weight.float()) + bias
    y = linear(x)
    assert y.dtype == torch.float32 and y.shape == (rows, 96)
    # The product's own output is rounded to bf16 (oneDNN's and F.linear's alike).
    torch.testing.assert_close(y, expected, rtol=1e-2, atol=5e-2)
    torch.testing.assert_close(linear(x, residual=residual), residual + y)


@pytest.fixture(scope="module")
def bf16_runs(tiny_llama):
    prompts = [{"prompt_token_ids": [1] + [(i * 11 + n) % 500 + 3 for i in range(n)]}
               for n in (1, 6, 19, 33)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    runs, engines = [], []
    with pytest.MonkeyPatch.context() as patch:
        for disabled in ("", "1"):
            patch.setenv("MINIVLLM_DISABLE_KERNELS", disabled)
            llm = LLM(str(tiny_llama), dtype="bfloat16", block_size=4, num_kv_blocks=96)
            runs.append(llm.generate(prompts, params, use_tqdm=False))
            engines.append(llm.llm_engine.runner)
    return runs, engines


def test_a_bf16_engine_holds_bf16_linears_and_kv_with_fp32_activations(bf16_runs):
    _, (runner, _) = bf16_runs
    assert runner.dtype == torch.float32 and runner.kv_dtype == torch.bfloat16
    assert runner.k_cache.dtype == torch.bfloat16
    head, gate_up = runner.model.lm_head, runner.model.layers[0].mlp.gate_up
    if library.amx():  # bf16 weights packed as AMX tiles, the LM head too (fp32 logits)
        assert isinstance(head, AmxBf16Linear) and isinstance(gate_up, AmxBf16Linear)
        assert head.packed.dtype == gate_up.packed.dtype == torch.bfloat16
    elif not native_bf16() and library.panel_width():
        # no AVX512-BF16: stored in bf16, fp32 arithmetic, the LM head too (fp32 logits)
        assert isinstance(head, PanelLinear) and isinstance(gate_up, PanelLinear)
        assert head.packed.dtype == gate_up.packed.dtype == torch.bfloat16
    elif library.panel_bf16_dot():
        # AVX512-BF16: oneDNN's bf16 products, and the LM head on panel_gemm.c's bf16 dot
        # products, whose logits are not rounded to bf16
        assert isinstance(head, PanelLinear) and head.stored == "bf16 pairs"
        assert runner.model.layers[0].mlp.gate_up.weight.dtype == torch.bfloat16
    else:  # fp32 LM head: logits rounded to bf16 tie (SmolLM2's first answer token flipped)
        assert runner.model.lm_head.weight.dtype == torch.float32
        assert runner.model.layers[0].mlp.gate_up.weight.dtype == torch.bfloat16
    assert runner.model.embed.dtype == torch.float32
    assert runner.use_kernels == library.available(torch.device("cpu"), torch.float32)


def test_bf16_greedy_is_the_same_with_kernels_on_and_off(bf16_runs):
    (fast, slow), _ = bf16_runs
    for a, b in zip(fast, slow):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids


@pytest.mark.parametrize("checkpoint, flags, expected", [
    ("float32", {"avx2", "avx512_bf16"}, torch.float32),  # an fp32 checkpoint stays exact
    ("bfloat16", {"avx2", "avx512_bf16"}, torch.bfloat16),
    ("float16", {"avx2", "amx_bf16"}, torch.bfloat16),
    (None, {"avx2", "avx512_bf16"}, torch.bfloat16),  # a GGUF file names no dtype
    # no bf16 dot products: a bf16 checkpoint's weights stay bf16 (fp32 arithmetic, exact);
    # anything else would be rounded, so fp32; below AVX2 bf16 would be emulated
    ("bfloat16", {"avx2", "avx512f"}, torch.bfloat16),
    ("float16", {"avx2"}, torch.float32),
    (None, {"avx2"}, torch.float32),
    ("bfloat16", {"sse4_2"}, torch.float32),
])
def test_dtype_auto_on_the_cpu(checkpoint, flags, expected, monkeypatch):
    from types import SimpleNamespace

    from minivllm.model import loader

    monkeypatch.setattr(loader, "cpu_features", lambda: frozenset(flags))
    monkeypatch.delenv("MINIVLLM_DISABLE_KERNELS", raising=False)
    config = SimpleNamespace(dtype=checkpoint)
    assert loader.resolve_dtype("auto", config, torch.device("cpu")) == expected
    if "avx512_bf16" not in flags and "amx_bf16" not in flags:  # no panel_gemm.c: emulated
        monkeypatch.setenv("MINIVLLM_DISABLE_KERNELS", "1")
        assert loader.resolve_dtype("auto", config, torch.device("cpu")) == torch.float32
        monkeypatch.delenv("MINIVLLM_DISABLE_KERNELS")
    assert loader.resolve_dtype("float32", config, torch.device("cpu")) == torch.float32
    # Elsewhere (and where no device is given) auto is the checkpoint's dtype.
    assert loader.resolve_dtype("auto", config) == (
        getattr(torch, checkpoint) if checkpoint else torch.float32)
