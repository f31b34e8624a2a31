"""`minivllm check-kernels`: a model through the kernels and through torch, per layer.

It must say OK where the paths agree, and catch a kernel bug naming the first layer it
touches: the C RMSNorm that read a strided view as dense rows (commit 7532003), re-injected
here, broke Gemma 3 with one KV head from layer 0 (its per-head k-norm reads such a view)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig

from minivllm.cli import main
from minivllm.model.kernels import fused_ops, library
from tests.kernel_marks import needs_kernels

# past the window of 8, prefilled in chunks of 16 (a chunk reads the cache of the previous)
PROMPT = ["--prompt-token-ids", *(str((i * 7) % 500 + 3) for i in range(21)),
          "--chunk-size", "16"]


@pytest.fixture(scope="module")
def gemma3_one_kv_head(tmp_path_factory):
    """Gemma 3 1B's attention shape: head_dim 256, 4 heads and 1 KV head, sliding layers."""
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=8,
        query_pre_attn_scalar=256, max_position_embeddings=512, initializer_range=0.2,
        tie_word_embeddings=False, layer_types=["sliding_attention", "full_attention"])
    path = tmp_path_factory.mktemp("gemma3-1kv")
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    return path


def check(model_dir, capsys) -> tuple[int, str]:
    status = main(["check-kernels", str(model_dir), *PROMPT])
    return status, capsys.readouterr().out


def layer_line(out: str, name: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(name + " "))


@needs_kernels
@pytest.mark.parametrize("kind", ["gemma3", "llama"])
def test_ok_when_the_kernels_match_torch(kind, tiny_model_dirs, capsys):
    status, out = check(tiny_model_dirs[kind], capsys)
    assert status == 0, out
    assert out.splitlines()[-1] == "OK: the kernels match torch"
    assert "greedy tokens: identical" in out
    for name in ("layer 0", "layer 1", "logits"):
        assert "differs" not in layer_line(out, name)


@needs_kernels
def test_ok_on_gemma3_with_one_kv_head(gemma3_one_kv_head, capsys):
    status, out = check(gemma3_one_kv_head, capsys)
    assert status == 0, out


@needs_kernels
def test_catches_the_strided_rms_norm_bug_at_layer_0(gemma3_one_kv_head, capsys,
                                                     monkeypatch):
    fixed = fused_ops.rms_norm

    def reads_dense_rows(x, weight, eps):  # the bug: a view's row stride ignored
        return fixed(x.as_strided(x.shape, (x.shape[1], 1)), weight, eps)

    monkeypatch.setattr(fused_ops, "rms_norm", reads_dense_rows)
    status, out = check(gemma3_one_kv_head, capsys)
    assert status == 1, out
    assert "<- differs" in layer_line(out, "layer 0")
    assert out.splitlines()[-1] == "FAIL: the kernels differ from torch from layer 0 on"


@needs_kernels
def test_names_a_later_layer_when_only_it_differs(tiny_model_dirs, capsys, monkeypatch):
    """An error in layer 1's fused SiLU-and-mul only (the kernels run layer by layer: odd
    calls are layer 1's): layer 0 still agrees."""
    fixed, calls = fused_ops.silu_and_mul, []

    def wrong_on_layer_1(x):
        calls.append(None)
        out = fixed(x)
        return out + 1e-2 if len(calls) % 2 == 0 else out

    monkeypatch.setattr(fused_ops, "silu_and_mul", wrong_on_layer_1)
    status, out = check(tiny_model_dirs["llama"], capsys)
    assert status == 1, out
    assert "differs" not in layer_line(out, "layer 0")
    assert "<- differs" in layer_line(out, "layer 1")
    assert out.splitlines()[-1] == "FAIL: the kernels differ from torch from layer 1 on"


def test_refuses_without_kernels(tiny_model_dirs, capsys, monkeypatch):
    monkeypatch.setenv("MINIVLLM_DISABLE_KERNELS", "1")
    assert main(["check-kernels", str(tiny_model_dirs["llama"]), *PROMPT]) == 2
    assert "MINIVLLM_DISABLE_KERNELS is set" in capsys.readouterr().err


def test_gemm_table_names_the_faster_way_and_its_roof():
    """A fake timer (torch twice as fast as oneDNN at one row, oneDNN twice torch at 512,
    the fp32 panels, where they run, slower): the chosen way, its GFLOP/s and the roof,
    memory-bound at one row and compute-bound at many."""
    from types import SimpleNamespace

    from minivllm.bench.check_gemm import gemm_table, model_shapes

    cfg = SimpleNamespace(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=96, vocab_size=200)
    assert [(s.name, s.n, s.k) for s in model_shapes(cfg)] == [
        ("qkv", 128, 64), ("o", 64, 64), ("gate_up", 192, 64), ("down", 64, 96),
        ("lm_head", 200, 64)]

    def timer(ways, k, rows):
        fast = "torch" if rows == 1 else "oneDNN"
        return {name: 1e-6 if name == fast else 2e-6 if name != "fp32 panels" else 4e-6
                for name in ways}
    peaks = {"fp32": 100.0, "int8_avx2": 300.0}
    lines = gemm_table(cfg, "float32", (1, 512), peaks, bandwidth=10e9, timer=timer)
    o_rows = [line for line in lines if line.startswith("| o |")]
    if "oneDNN" not in lines[2]:
        pytest.skip("one fp32 way here (no oneDNN)")
    # one row: 2 * 64 * 64 operations in 1 us = 8.2 GFLOP/s; the memory roof is 10 GB/s
    # times 8192 operations per 16,384 + 512 bytes moved = 4.8 GFLOP/s
    panels = (", fp32 panels 2.0", ", fp32 panels 1048.6") if library.panel_width() else ("", "")
    assert o_rows[0] == (f"| o | 64 x 64 | 1 | oneDNN 4.1, torch 8.2{panels[0]} | torch | "
                         "4.8 (memory) | 169% |")
    assert o_rows[1].startswith(f"| o | 64 x 64 | 512 | oneDNN 4194.3, torch 2097.2{panels[1]} "
                                "| oneDNN | 100.0 (compute) |")


def test_each_way_is_held_to_the_peak_of_the_instructions_it_runs():
    from minivllm.bench.check_gemm import way_peak

    peaks = {"fp32": 100.0, "int8_avx2": 300.0, "int8_vnni": 400.0, "bf16": 200.0}
    assert way_peak("fp32 panels", peaks) == way_peak("bf16 panels", peaks) == 100e9
    assert way_peak("bf16 dot panels", peaks) == way_peak("oneDNN bf16", peaks) == 200e9
    assert way_peak("int8", peaks) == 400e9
    del peaks["bf16"]  # a CPU without AVX512-BF16: no bf16 peak measured, the memory roof
    assert way_peak("bf16 dot panels", peaks) is None


@needs_kernels
def test_check_kernels_gemm_prints_the_table(tiny_llama, capsys):
    assert main(["check-kernels", str(tiny_llama), "--gemm", "--rows", "1", "8"]) == 0
    out = capsys.readouterr().out
    assert "measured peaks: fp32 FMA" in out and "| lm_head |" in out
    assert out.count("| qkv |") == 2
