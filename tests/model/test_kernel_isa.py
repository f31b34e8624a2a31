"""Run-time ISA dispatch of the C kernels (isa.py, build.py): the levels read from
/proc/cpuinfo, MINIVLLM_ISA and its errors, one library per level compiled for exactly that
level's features and cached under a key of its own, the start-up line that names it, and
the kernels-vs-torch tests of the other files run again under every other level this CPU
has (the suite itself runs the highest, or MINIVLLM_ISA's)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from minivllm import LLM, SamplingParams
from minivllm.cli import main
from minivllm.model.kernels import build, isa, library
from tests.model.every_isa_level import LEVELS_ENV

needs_compiler = pytest.mark.skipif(build.find_compiler() is None, reason="no C compiler")
ROOT = Path(__file__).parents[2]

# /proc/cpuinfo flags of the fleet's kinds of CPU (the ones that matter here, and a few
# others around them).
BASE = "fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt avx"
AVX2 = f"{BASE} avx2 fma f16c bmi1 bmi2"
AVX512 = f"{AVX2} avx512f avx512bw avx512cd avx512dq avx512vl"
CPUS = {  # name -> (flags, the levels it runs)
    "Zen 3": (AVX2, ["generic", "avx2"]),
    "Alder Lake": (f"{AVX2} avx_vnni", ["generic", "avx2", "avx_vnni"]),
    "Ice Lake": (f"{AVX512} avx512_vnni", ["generic", "avx2", "avx512", "avx512_vnni"]),
    "Zen 4": (f"{AVX512} avx512_vnni avx512_bf16",
              ["generic", "avx2", "avx512", "avx512_vnni", "avx512_bf16"]),
    "Sapphire Rapids": (f"{AVX512} avx512_vnni avx512_bf16 avx_vnni amx_tile amx_int8 "
                        "amx_bf16", list(isa.LEVELS)),
    "Sandy Bridge": (BASE, ["generic"]),
    "Xeon Phi": (f"{AVX2} avx512f avx512cd", ["generic", "avx2"]),  # no bw / dq / vl
}
ZEN3, ZEN4 = (frozenset(CPUS[name][0].split()) for name in ("Zen 3", "Zen 4"))


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "kernels"


def _info(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def _warnings(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_cpuinfo_flags_are_read_from_the_first_processor():
    x86 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f\n"
           "bugs\t\t: sysret_ss_attrs\n\nprocessor\t: 1\nflags\t\t: fpu avx2 avx512f\n")
    assert isa.parse_cpuinfo(x86) == {"fpu", "avx2", "avx512f"}
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes\n"
    assert isa.parse_cpuinfo(arm) == {"fp", "asimd", "evtstrm", "aes"}
    assert isa.parse_cpuinfo("") == frozenset()


@pytest.mark.parametrize("name", CPUS)
def test_levels_of_each_kind_of_cpu(name):
    flags, levels = CPUS[name]
    cpu_flags = isa.parse_cpuinfo(f"processor\t: 0\nflags\t\t: {flags}\n")
    assert isa.supported(cpu_flags, "x86_64") == levels
    assert isa.select("", cpu_flags, "x86_64") == (levels[-1], False)  # the highest


def test_other_architectures_run_the_generic_level():
    neon = frozenset("fp asimd aes".split())
    assert isa.supported(neon, "aarch64") == ["generic"]
    assert isa.select("", neon, "aarch64") == ("generic", False)
    assert isa.compiler_flags("generic", "aarch64") == []


def test_minivllm_isa_forces_a_lower_level():
    assert isa.select("avx2", ZEN4, "x86_64") == ("avx2", True)
    assert isa.select(" AVX512 ", ZEN4, "x86_64") == ("avx512", True)
    assert isa.select("generic", ZEN4, "x86_64") == ("generic", True)


def test_minivllm_isa_naming_a_level_the_cpu_lacks_is_an_error():
    with pytest.raises(isa.IsaError, match=r"MINIVLLM_ISA=avx512_vnni: this CPU lacks "
                       r"avx512_vnni avx512bw avx512cd avx512dq avx512f avx512vl; it runs "
                       r"the levels generic, avx2$"):
        isa.select("avx512_vnni", ZEN3, "x86_64")
    with pytest.raises(isa.IsaError, match="lacks avx2 f16c fma; it runs the levels generic$"):
        isa.select("avx2", frozenset("fp asimd".split()), "aarch64")


def test_minivllm_isa_naming_no_level_is_an_error_listing_them():
    with pytest.raises(isa.IsaError, match=r"MINIVLLM_ISA=avx-512 is not a kernel ISA level: "
                       r"choose one of generic, avx2, avx_vnni, avx512, avx512_vnni, "
                       r"avx512_bf16, amx \(this CPU runs generic, avx2\)$"):
        isa.select("avx-512", ZEN3, "x86_64")


def test_each_level_compiles_for_its_features_only():
    for name in isa.LEVELS:
        flags = isa.compiler_flags(name, "x86_64")
        assert flags[0] == "-march=x86-64"  # not the compiler's default, nor native
        assert "-march=native" not in flags
        assert {f.removeprefix("-m").replace("-", "").replace("_", "") for f in flags[1:]} == {
            f.replace("_", "") for f in isa.features(name)}
    assert not any("avx512" in f for f in isa.compiler_flags("avx_vnni", "x86_64"))


def test_cache_key_differs_per_level_not_per_cpu(monkeypatch, kernel_cache):
    paths = {name: build.library_path("/usr/bin/cc", name) for name in isa.LEVELS}
    assert len(set(paths.values())) == len(isa.LEVELS)
    assert all(f"-{name}-" in path.name and path.parent == kernel_cache
               for name, path in paths.items())
    assert build.library_path("/usr/bin/clang", "avx2") != paths["avx2"]
    # another CPU sharing the cache finds the same file for a level they both have
    monkeypatch.setattr(isa, "cpu_features", lambda: ZEN3)
    assert build.library_path("/usr/bin/cc", "avx2") == paths["avx2"]


@cache
def _library_of(level: str):
    """This machine's library of the level (in the tests' cache: built once, also used by
    the subprocess below)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(isa.ENV, level)
        return build.load()


MACHINE_LEVELS = isa.supported(isa.cpu_features())


@needs_compiler
@pytest.mark.parametrize("level", MACHINE_LEVELS)
def test_each_library_is_compiled_for_exactly_its_level(level):
    """The compiler's macros, as the library reports them: the avx2 library holds no
    AVX-512 variant, the avx512_vnni one the VNNI variants, and so on."""
    lib = _library_of(level)
    assert lib is not None and lib.isa_level == level
    assert set(lib.isa_features) == isa.features(level)


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump is not installed (the "
                    "test above checks the same through the compiler's macros)")
@needs_compiler
def test_only_avx512_libraries_hold_zmm_instructions():
    for level in MACHINE_LEVELS:
        code = subprocess.run(["objdump", "-d", _library_of(level).path],
                              capture_output=True, text=True, check=True).stdout
        assert ("%zmm" in code) == ("avx512f" in isa.features(level)), level


@needs_compiler
@pytest.mark.skipif("avx512" not in MACHINE_LEVELS, reason="needs an AVX-512 machine")
def test_an_avx2_cpu_never_loads_an_avx512_library_from_a_shared_cache(tmp_path,
                                                                       monkeypatch, caplog):
    compiler = build.find_compiler()
    built = {level: _library_of(level).path for level in ("avx2", "avx512")}
    monkeypatch.setattr(isa, "cpu_features", lambda: ZEN3)
    monkeypatch.delenv(isa.ENV, raising=False)

    def cache_holding(name: str, files: dict[str, str]) -> Path:
        """A cache (a new path each: dlopen hands back a path it has loaded) with the
        library of level files[x] under level x's name."""
        monkeypatch.setenv("MINIVLLM_CACHE", str(tmp_path / name))
        build.cache_dir().mkdir(parents=True)
        for level, source in files.items():
            shutil.copy(built[source], build.library_path(compiler, level))
        return build.library_path(compiler, "avx2")

    cache_holding("filled-by-avx512", {"avx2": "avx2", "avx512": "avx512"})
    lib = build.load()
    assert lib.isa_level == "avx2" and set(lib.isa_features) == isa.features("avx2")
    # a foreign file under the avx2 library's name is refused, not run
    target = cache_holding("foreign", {"avx2": "avx512"})
    assert build.load() is None
    assert (f"{target} was compiled for avx512f avx512bw avx512cd avx512dq avx512vl, which "
            "this CPU lacks: using torch") in _warnings(caplog)


@pytest.fixture
def compiler_without(tmp_path, monkeypatch):
    """$CC set to the machine's compiler refusing some flags, as an older one would."""
    def make(*flags: str) -> str:
        script = tmp_path / "old-cc"
        cases = "|".join(flags)
        script.write_text(f'#!/bin/sh\nfor a in "$@"; do case "$a" in {cases}) echo '
                          f'"unrecognized command-line option $a" >&2; exit 1;; esac; done\n'
                          f'exec {build.find_compiler()} "$@"\n')
        script.chmod(0o755)
        monkeypatch.setenv("CC", str(script))
        return str(script)
    return make


@needs_compiler
def test_a_compiler_without_the_cpus_level_builds_the_next_one_down(compiler_without,
                                                                    kernel_cache,
                                                                    monkeypatch, caplog):
    compiler = compiler_without("-mavx512bf16", "-mavx512vnni")
    monkeypatch.setattr(isa, "cpu_features", lambda: ZEN4)
    assert build._buildable_level(compiler, "avx512_bf16", build.SOURCE_DIR) == "avx512"
    assert (f"{compiler} cannot build the avx512_bf16 kernels (-mavx512bf16): using the "
            "avx512 ones") in _warnings(caplog)


@needs_compiler
def test_a_forced_level_the_compiler_cannot_build_falls_back_to_torch(compiler_without,
                                                                      kernel_cache,
                                                                      monkeypatch, caplog):
    compiler_without("-mavx2")
    monkeypatch.setenv(isa.ENV, "avx2" if "avx2" in MACHINE_LEVELS else "generic")
    if os.environ[isa.ENV] == "generic":
        pytest.skip("this CPU has no avx2 level to force")
    assert build.load() is None
    assert "building the C kernels failed, using torch: unrecognized command-line option " \
           "-mavx2" in _warnings(caplog)


FORCED = "avx2" if "avx2" in MACHINE_LEVELS else "generic"
FORCED_LINE = {"avx2": "C kernels: avx2 (avx2 fma f16c)",
               "generic": "C kernels: generic (baseline instructions only)"}[FORCED] + (
    f", forced by MINIVLLM_ISA (this CPU's highest: {MACHINE_LEVELS[-1]})")


@needs_compiler
def test_engine_start_up_logs_the_kernels_level(tiny_llama, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(library, "_library", cache(build.load))  # not this process's library
    monkeypatch.delenv(isa.ENV, raising=False)
    assert library.isa_summary().startswith(f"{MACHINE_LEVELS[-1]} (")
    assert f"C kernels: {library.isa_summary()}" in _info(caplog)

    caplog.clear()
    monkeypatch.setattr(library, "_library", cache(build.load))
    monkeypatch.setenv(isa.ENV, FORCED)
    llm = LLM(str(tiny_llama), block_size=4, num_kv_blocks=64)
    assert FORCED_LINE in _info(caplog).splitlines()
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    assert len(llm.generate([{"prompt_token_ids": [1, 5, 9]}], params,
                            use_tqdm=False)[0].outputs[0].token_ids) == 3


@needs_compiler
def test_check_kernels_prints_the_level(tiny_llama, monkeypatch, capsys):
    monkeypatch.setattr(library, "_library", cache(build.load))
    monkeypatch.setenv(isa.ENV, FORCED)
    status = main(["check-kernels", str(tiny_llama), "--prompt-token-ids", "1", "5", "9",
                   "--decode-steps", "1"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.splitlines()[0] == FORCED_LINE


# The kernels-vs-torch tests of the other files: attention (decode, prefill, fp32, bf16,
# int8 and fp8 caches), the fused ops, argmax, the sampler, the int8, bf16 and GGUF GEMMs, and real models'
# shapes through the engine.
KERNEL_TESTS = [
    "tests/model/test_fast_paths.py::test_c_decode_kernel_matches_reference",
    "tests/model/test_fast_paths.py::test_fused_layer_ops_match_torch",
    "tests/model/test_fast_paths.py::test_c_argmax_matches_torch_first_index_on_ties",
    "tests/model/test_fast_paths.py::test_fused_rope_and_kv_write_match_torch",
    "tests/model/test_fast_paths.py::test_loading_the_kernels_keeps_subnormal_floats",
    "tests/model/test_prefill_kernel.py",
    "tests/model/test_kv_cache_dtype.py::test_decode_kernel_reads_bf16_cache",
    "tests/model/test_kv_cache_dtype.py::test_prefill_kernel_reads_bf16_cache",
    "tests/model/test_kv_cache_dtype.py::test_fused_kv_write_rounds_as_torch",
    "tests/model/test_kv_cache_quant.py::test_decode_kernel_reads_quantized_cache",
    "tests/model/test_kv_cache_quant.py::test_prefill_kernel_reads_quantized_cache",
    "tests/model/test_kv_cache_quant.py::test_fused_kv_write_quantizes_as_torch",
    "tests/model/test_quantization.py::test_kernel_matches_torch_reference",
    "tests/model/test_quantization.py::test_kernel_zero_rows_and_extremes",
    "tests/model/test_gguf_kernel.py",
    "tests/model/test_gguf_dequant.py",
    "tests/model/test_gguf_repacked.py",
    "tests/model/test_panel_gemm.py",
    "tests/model/test_gemm_edge_rows.py",
    "tests/model/test_attention.py::test_mixed_batch_fast_path_matches_reference",
    "tests/model/test_sampler.py::test_uniforms_match_between_c_and_python",
    "tests/model/test_sampler.py::test_c_and_torch_paths_agree_token_for_token",
    "tests/model/test_sampler.py::test_kernel_restores_penalized_logits",
    "tests/model/test_sampler.py::test_greedy_is_the_argmax",
    "tests/model/test_sampler.py::test_logprobs_are_of_the_raw_distribution",
    "tests/model/test_kernels_real_shapes.py",
    "tests/lora/test_lora_layers.py",
]
# Tests of the amx level alone (they skip below it): the suite's own run covers them on a
# CPU with AMX.
AMX_ONLY = ["tests/model/test_gguf_kernel.py::test_amx_path_runs_from_its_row_count"]


@pytest.mark.e2e  # minutes: one kernel suite per level; `make test-e2e` runs it in CI
@needs_compiler
def test_kernel_tests_pass_at_every_other_level_of_this_cpu():
    levels = [level for level in MACHINE_LEVELS if level != isa.select()[0]]
    if not levels:
        pytest.skip("this CPU runs one level only: the suite itself tests it")
    for level in levels:  # built here, once per level and source change, not per test
        assert _library_of(level) is not None, level
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.model.every_isa_level",
         "-p", "no:cacheprovider", *KERNEL_TESTS,
         *(arg for test in AMX_ONLY for arg in ("--deselect", test))],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, LEVELS_ENV: ",".join(levels), "OMP_NUM_THREADS": "1"})
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    counts = {line.split()[3].rstrip(":"): int(line.split()[4]) for line in out.splitlines()
              if line.startswith("kernel ISA level ")}
    assert list(counts) == levels and len(set(counts.values())) == 1, out[-3000:]
    assert next(iter(counts.values())) > 50, out[-3000:]  # every file's tests were found
    assert "skipped" not in run.stdout.splitlines()[-1], out[-3000:]  # no kernels built?
