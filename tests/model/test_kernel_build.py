"""Building and loading the C kernels: kernels.h against the definitions and the Python
callers, a kernel built from its .c file and its one declaration, the cache key, and every way of not getting the kernels (no compiler, a failed
build, a library that does not load) ending on the torch path with a warning."""

import _ctypes
import gc
import logging
import shutil
from functools import cache
from pathlib import Path

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.model.kernels import build, declarations, isa, library, sampler_ops

needs_compiler = pytest.mark.skipif(build.find_compiler() is None, reason="no C compiler")
CPU = torch.device("cpu")


def _sources(tmp_path: Path, edit=None) -> Path:
    """A copy of the kernel sources, with kernels.h passed through edit."""
    for path in [*build.headers(), *build.sources()]:
        shutil.copy(path, tmp_path / path.name)
    if edit is not None:
        text = (tmp_path / declarations.HEADER).read_text()
        (tmp_path / declarations.HEADER).write_text(edit(text))
    return tmp_path


def _warnings(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


@pytest.fixture
def failing_compiler(tmp_path, monkeypatch):
    """$CC set to a "compiler" that always fails."""
    compiler = tmp_path / "failing-cc"
    compiler.write_text("#!/bin/sh\necho 'cannot compile' >&2\nexit 1\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    return str(compiler)


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "kernels"


def test_header_declares_every_kernel_as_its_source_defines_it():
    declared = declarations.read(build.SOURCE_DIR, build.sources())
    assert {"paged_decode_attention_f32", "paged_prefill_attention_f32", "rms_norm_f32",
            "silu_and_mul_f32", "rope_write_kv_f32", "argmax_rows_f32", "sample_rows_f32",
            "sampler_uniforms_f64", "int8_linear_f32", "gguf_linear_f32", "gguf_dequantize_f32",
            "int8_linear_amx_f32", "gguf_linear_amx_f32", "bf16_linear_amx_f32",
            "gguf_repacked_supported", "gguf_repacked_bytes", "gguf_repack",
            "gguf_repacked_linear_f32", "gguf_repacked_silu_mul_supported",
            "gguf_repacked_silu_mul_f32", "paged_prefill_attention_amx",
            "paged_prefill_attention_dpbf16",
            "panel_width", "panel_bf16_dot",
            "panel_linear_f32", "lora_sgmv_f32", "lora_sgmv_bf16w",
            "kernels_isa_features"} == set(declared)
    assert declared["rms_norm_f32"].names == [
        "x", "weight", "out", "rows", "cols", "eps", "num_threads"]


# Tampered headers: each would have the kernels called with arguments in the wrong places.
SWAP_SAME_TYPE = ("int num_heads, int num_kv_heads, int head_dim, int block_size,\n"
                  "                                int max_blocks",
                  "int num_kv_heads, int num_heads, int head_dim, int block_size,\n"
                  "                                int max_blocks")
NARROWED = ("int64_t rows, int cols,\n                  float eps",
            "int rows, int cols,\n                  float eps")
NOT_DEFINED = ("void argmax_rows_f32(", "void argmax_rows(")


@pytest.mark.parametrize("old,new,complaint", [
    (*SWAP_SAME_TYPE, "paged_decode_attention_f32 in paged_decode_attention.c does not match"),
    (*NARROWED, "rms_norm_f32 in ops.c does not match"),
    (*NOT_DEFINED, "argmax_rows: 0 definitions"),
    ("int64_t n);", "size_t n);", "cannot parse kernels.h"),  # not a type it knows
])
def test_a_header_that_does_not_match_the_sources_is_an_error(tmp_path, old, new, complaint):
    source_dir = _sources(tmp_path, lambda text: text.replace(old, new, 1))
    assert (source_dir / declarations.HEADER).read_text() != (
        build.SOURCE_DIR / declarations.HEADER).read_text()
    with pytest.raises(declarations.DeclarationError, match=complaint):
        declarations.read(source_dir, build.sources(source_dir))


@needs_compiler
def test_a_mismatched_header_falls_back_to_torch_with_a_warning(tmp_path, kernel_cache,
                                                                 caplog):
    source_dir = _sources(tmp_path, lambda text: text.replace(*SWAP_SAME_TYPE, 1))
    assert build.load(source_dir) is None
    assert "do not match kernels.h" in _warnings(caplog)
    assert not kernel_cache.exists()  # nothing was built from them


@needs_compiler
def test_an_exported_function_missing_from_the_header_fails_the_build(tmp_path, kernel_cache,
                                                                      caplog):
    def drop_argmax(text):
        start = text.index("void argmax_rows_f32(")
        return text[:start] + text[text.index(";", start) + 1:]
    assert build.load(_sources(tmp_path, drop_argmax)) is None
    assert "building the C kernels failed" in _warnings(caplog)
    assert "argmax_rows_f32" in _warnings(caplog)  # the compiler's missing-prototypes error


@pytest.mark.skipif(not library.available(CPU, torch.float32), reason="no C kernels built here")
def test_kernels_are_called_by_keyword_as_the_header_names_them():
    lib = library._library()
    x, out = torch.randn(2, 5), torch.empty(2, dtype=torch.long)
    with pytest.raises(TypeError):  # positional: the order is the header's business
        lib.argmax_rows_f32(x.data_ptr(), out.data_ptr(), 2, 5, 1)
    with pytest.raises(TypeError, match="columns"):  # a name kernels.h does not have
        lib.argmax_rows_f32(x=x.data_ptr(), out=out.data_ptr(), rows=2, columns=5,
                            num_threads=1)
    lib.argmax_rows_f32(x=x.data_ptr(), out=out.data_ptr(), rows=2, cols=5, num_threads=1)
    assert torch.equal(out, x.argmax(1))


# A new kernel: its .c file and its one declaration in kernels.h (and a test, this one).
TOY_DECLARATION = "void scale_f32(const float *x, float *out, int64_t n, float factor);"
TOY_SOURCE = """#include "kernels.h"

void scale_f32(const float *x, float *out, int64_t n, float factor) {
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * factor;
}
"""


@needs_compiler
def test_a_new_kernel_is_its_c_file_and_its_declaration(tmp_path, kernel_cache):
    """A toy kernel in a folder of its own, beside isa_info.c (which every library holds,
    for the loader's check of its ISA): built, and bound from its declaration."""
    shutil.copy(build.SOURCE_DIR / "isa_info.c", tmp_path)
    (tmp_path / declarations.HEADER).write_text(
        f"#include <stdint.h>\nint kernels_isa_features(void);\n{TOY_DECLARATION}\n")
    (tmp_path / "scale.c").write_text(TOY_SOURCE)
    lib = build.load(tmp_path)
    gc.collect()  # the library stays loaded as long as its functions are held
    x, out = torch.randn(10), torch.empty(10)
    lib.scale_f32(x=x.data_ptr(), out=out.data_ptr(), n=10, factor=0.5)
    assert torch.equal(out, x * 0.5)
    with pytest.raises(TypeError):  # bound by keyword, as every kernel
        lib.scale_f32(x.data_ptr(), out.data_ptr(), 10, 0.5)


@needs_compiler
def test_arguments_reordered_in_c_reach_their_parameters(tmp_path, kernel_cache, monkeypatch):
    """Two same-typed parameters swapped in kernels.h and ops.c together: the compiler sees
    nothing wrong, and a positional call would pass rows as cols."""
    swap = ("int64_t rows, int64_t cols,", "int64_t cols, int64_t rows,")
    source_dir = _sources(tmp_path, lambda text: text.replace(*swap))
    ops = (source_dir / "ops.c").read_text()
    assert swap[0] in ops
    (source_dir / "ops.c").write_text(ops.replace(*swap))
    monkeypatch.setattr(library, "_library", cache(lambda: build.load(source_dir)))
    x = torch.randn(3, 50)
    assert torch.equal(sampler_ops.argmax(x), x.argmax(1))


@needs_compiler
def test_kernels_build_where_a_compiler_is_found(kernel_cache):
    """Else every kernel test would skip, unnoticed, on a machine whose build broke."""
    assert build.load() is not None
    assert [p.name for p in kernel_cache.iterdir()] == [build.library_path(
        build.find_compiler(), isa.select()[0]).name]  # one library: this CPU's level


def test_no_compiler_falls_back_to_torch_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing to run there
    monkeypatch.delenv("CC", raising=False)
    assert build.load() is None
    assert "no C compiler found" in _warnings(caplog)


def test_a_failed_build_falls_back_to_torch_with_a_warning(failing_compiler, kernel_cache,
                                                          caplog):
    assert build.load() is None
    assert "building the C kernels failed, using torch: cannot compile" in _warnings(caplog)
    assert list(kernel_cache.iterdir()) == []  # no half-built library left behind


@pytest.mark.parametrize("cached", ["garbage", "without the kernels"])
def test_a_library_that_does_not_load_falls_back_to_torch(cached, failing_compiler,
                                                          kernel_cache, caplog):
    # not run: the library is in the cache
    target = build.library_path(failing_compiler, isa.select()[0])
    target.parent.mkdir(parents=True)
    if cached == "garbage":
        target.write_bytes(b"not a shared library")
    else:
        if not hasattr(_ctypes, "__file__"):
            pytest.skip("_ctypes is built into this Python: no shared library to copy")
        shutil.copy(_ctypes.__file__, target)  # loads, but has no rms_norm_f32 & co.
    assert build.load() is None
    assert f"cannot load the C kernels from {target}" in _warnings(caplog)


def test_engine_without_a_compiler_runs_the_torch_paths(tiny_llama, tmp_path, monkeypatch,
                                                        caplog):
    prompts = [{"prompt_token_ids": [1] + [(i * 7 + n) % 500 + 3 for i in range(n)]}
               for n in (1, 9, 30)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    monkeypatch.setenv("MINIVLLM_DISABLE_KERNELS", "1")
    llm = LLM(str(tiny_llama), block_size=4, num_kv_blocks=64)
    reference = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    monkeypatch.delenv("MINIVLLM_DISABLE_KERNELS")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(library, "_library", cache(build.load))  # not this process's build
    llm = LLM(str(tiny_llama), block_size=4, num_kv_blocks=64)
    assert "no C compiler found" in _warnings(caplog)
    assert not library.available(CPU, torch.float32)  # what every kernel caller asks
    assert [o.outputs[0].token_ids
            for o in llm.generate(prompts, params, use_tqdm=False)] == reference
