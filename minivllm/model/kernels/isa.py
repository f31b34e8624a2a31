"""The instruction-set levels the C kernels are built for, and which one this CPU runs.

Each level is a set of CPU features (named as in /proc/cpuinfo's flags) and the compiler
flags that enable exactly those: build.py compiles one library per level, so a library
never holds an instruction its level does not name, and the kernels' C code picks its
variants with the compiler's macros (`#ifdef __AVX512VNNI__`). The CPU runs the highest
level it has; MINIVLLM_ISA=<level> forces a lower one, so that every lower variant can be
tested on a higher machine. Not a chain: avx_vnni (AVX-VNNI on 256-bit registers, Alder
Lake and later, Zen 5) is neither below nor above avx512, and is ranked between them."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import cache

ENV = "MINIVLLM_ISA"


class IsaError(ValueError):
    """MINIVLLM_ISA names an unknown level, or one this CPU lacks."""


@dataclass(frozen=True)
class Level:
    name: str
    base: str | None  # the level this one adds to
    features: tuple[str, ...]  # /proc/cpuinfo flags it adds, each enabled by...
    flags: tuple[str, ...]  # ...these compiler flags


# Lowest first: the CPU's level is the last one it has. "generic" is the compiler's
# baseline (x86-64: SSE2; aarch64: NEON), for any CPU; -march=x86-64 overrides a compiler
# configured to assume more (some distributions default to x86-64-v2 or v3).
LEVELS = {level.name: level for level in [
    Level("generic", None, (), ()),
    Level("avx2", "generic", ("avx2", "fma", "f16c"), ("-mavx2", "-mfma", "-mf16c")),
    Level("avx_vnni", "avx2", ("avx_vnni",), ("-mavxvnni",)),
    Level("avx512", "avx2", ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
          ("-mavx512f", "-mavx512bw", "-mavx512cd", "-mavx512dq", "-mavx512vl")),
    Level("avx512_vnni", "avx512", ("avx512_vnni",), ("-mavx512vnni",)),
    Level("avx512_bf16", "avx512_vnni", ("avx512_bf16",), ("-mavx512bf16",)),
    Level("amx", "avx512_bf16", ("amx_tile", "amx_int8", "amx_bf16"),
          ("-mamx-tile", "-mamx-int8", "-mamx-bf16")),
]}
# Every feature a level can hold, in the order of the bits of kernels_isa_features() in
# isa_info.c: what a built library reports it was compiled for.
FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl",
            "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def is_x86(machine: str | None = None) -> bool:
    return (machine or platform.machine()).lower() in ("x86_64", "amd64", "i386", "i686")


def _chain(name: str) -> list[Level]:
    """The level and those below it, lowest first."""
    level = LEVELS[name]
    return [*(_chain(level.base) if level.base else []), level]


def features(name: str) -> frozenset[str]:
    """The CPU features a level needs."""
    return frozenset(f for level in _chain(name) for f in level.features)


def compiler_flags(name: str, machine: str | None = None) -> list[str]:
    """The flags that build for exactly this level (none beyond the baseline elsewhere
    than on x86)."""
    if not is_x86(machine):
        return []
    return ["-march=x86-64", *(f for level in _chain(name) for f in level.flags)]


def parse_cpuinfo(text: str) -> frozenset[str]:
    """The feature flags of /proc/cpuinfo's first processor (x86 "flags", ARM "Features")."""
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


@cache
def cpu_features() -> frozenset[str]:
    """This CPU's feature flags (empty where there is no /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            return parse_cpuinfo(f.read())
    except OSError:
        return frozenset()


# /proc/cpuinfo flags of bf16 dot products in hardware. torch's
# _is_mkldnn_bf16_supported() is also true on plain AVX-512, where oneDNN emulates them.
NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16"})


def native_bf16(cpu: frozenset[str] | None = None) -> bool:
    return bool((cpu_features() if cpu is None else cpu) & NATIVE_BF16)


def supported(cpu: frozenset[str], machine: str | None = None) -> list[str]:
    """The levels a CPU with these flags runs, lowest first; only generic off x86 (the
    other levels' flags are x86's)."""
    if not is_x86(machine):
        return ["generic"]
    return [name for name in LEVELS if features(name) <= cpu]


def select(env: str | None = None, cpu: frozenset[str] | None = None,
           machine: str | None = None) -> tuple[str, bool]:
    """(the level to run, whether MINIVLLM_ISA forced it): the highest level the CPU has,
    or the forced one. Raises IsaError for a level that is unknown or that the CPU lacks."""
    env = os.environ.get(ENV, "") if env is None else env
    cpu = cpu_features() if cpu is None else cpu
    have = supported(cpu, machine)
    forced = env.strip().lower()
    if not forced:
        return have[-1], False
    if forced not in LEVELS:
        raise IsaError(f"{ENV}={env} is not a kernel ISA level: choose one of "
                       f"{', '.join(LEVELS)} (this CPU runs {', '.join(have)})")
    if forced not in have:
        raise IsaError(f"{ENV}={env}: this CPU lacks {' '.join(sorted(features(forced) - cpu))}"
                       f"; it runs the levels {', '.join(have)}")
    return forced, True


def decode(bits: int) -> list[str]:
    """The features of kernels_isa_features()' bit mask."""
    return [name for i, name in enumerate(FEATURES) if bits >> i & 1]
