"""Builds the C kernels with the machine's C compiler and loads them with ctypes: no torch
headers, so the build takes about a second. The library is cached under
~/.cache/minivllm/kernels (or $MINIVLLM_CACHE/kernels), keyed by the sources, the compiler,
its flags and the CPU's feature flags: -march=native builds for this CPU's instruction set,
so a cache shared with another machine must not hand its library to a CPU that lacks some
of it. Without a compiler, or when the build, the header check or the load fails, `load`
logs a warning and returns None, and the callers keep their pure-torch paths."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

from minivllm.model.kernels import header

logger = logging.getLogger(__name__)
SOURCE_DIR = Path(__file__).parent
SOURCES = ["paged_attention.c", "ops.c", "sampler.c", "int8_gemm.c"]
# Compile with -ffast-math (vectorized expf), but link without it: linking with it adds
# crtfastmath.o, which turns on flush-to-zero for the whole process at load time. An
# exported function must be declared in kernels.h (missing-prototypes).
_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC",
          "-Werror=missing-prototypes"]
_LINK = ["-shared", "-fopenmp", "-lm"]


def find_compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def cpu_flags() -> str:
    """The CPU's feature flags from /proc/cpuinfo (x86 "flags", ARM "Features"), or, where
    there is none, the platform's processor name."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.partition(":")[2].split()))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def cache_dir() -> Path:
    root = os.environ.get("MINIVLLM_CACHE") or Path.home() / ".cache" / "minivllm"
    return Path(root) / "kernels"


def library_path(compiler: str, source_dir: Path = SOURCE_DIR) -> Path:
    """Where the library built from these sources, by this compiler, for this CPU lives."""
    key = hashlib.sha256()
    for name in [header.HEADER, *SOURCES]:
        key.update((source_dir / name).read_bytes())
    key.update(" ".join([compiler, *_FLAGS, *_LINK, platform.machine(), cpu_flags()]).encode())
    return cache_dir() / f"minivllm-kernels-{key.hexdigest()[:16]}.so"


def _run(cmd: list[str]) -> bool:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        logger.warning("building the C kernels failed, using torch: %s",
                       result.stderr.strip()[:500])
    return result.returncode == 0


def _build(compiler: str, source_dir: Path, target: Path) -> bool:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            objects = [str(Path(tmp) / f"{Path(source).stem}.o") for source in SOURCES]
            built = Path(tmp) / target.name
            if not all(_run([compiler, *_FLAGS, "-c", str(source_dir / source), "-o", obj])
                       for source, obj in zip(SOURCES, objects)):
                return False
            if not _run([compiler, *objects, *_LINK, "-o", str(built)]):
                return False
            os.replace(built, target)  # atomic: concurrent builders never see half a file
    except OSError as exc:  # e.g. a read-only cache directory, or a compiler that cannot run
        logger.warning("cannot build the C kernels in %s, using torch: %s", target.parent, exc)
        return False
    return True


def load(source_dir: Path = SOURCE_DIR) -> SimpleNamespace | None:
    """The kernels as keyword-only functions named as in kernels.h (built if needed), or
    None, with a warning saying why, when they cannot be had."""
    compiler = find_compiler()
    if compiler is None:
        logger.warning("no C compiler found: using the pure-torch paths")
        return None
    try:
        prototypes = header.read(source_dir, SOURCES)
    except header.HeaderError as exc:
        logger.warning("the C kernels do not match %s, using torch: %s", header.HEADER, exc)
        return None
    target = library_path(compiler, source_dir)
    if not target.exists() and not _build(compiler, source_dir, target):
        return None
    try:
        return header.bind(ctypes.CDLL(str(target)), prototypes)
    except (OSError, AttributeError) as exc:  # not a library, or one that lacks a function
        logger.warning("cannot load the C kernels from %s, using torch: %s", target, exc)
        return None
