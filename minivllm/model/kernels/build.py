"""Builds the C kernels with the machine's C compiler and loads them through cffi: no torch
headers, so a build takes about a second. Every .c file of the folder is compiled, and
each function kernels.h declares is bound (declarations.py): a new kernel is its .c file
and its declaration. One library per instruction-set level (isa.py), compiled with exactly
that level's flags (never -march=native) and cached under ~/.cache/minivllm/kernels (or
$MINIVLLM_CACHE/kernels), keyed by the sources, the compiler, its flags and the level: a
cache shared between machines hands each CPU a library of a level it has, and the
library's own report of what it was compiled for is checked against the CPU before it is
used. The CPU runs its highest level, or MINIVLLM_ISA's (a level it lacks is an error).
Without a compiler, or when the build, the declarations' check or the load fails, `load`
logs a warning and returns None, and the callers keep their pure-torch paths."""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from minivllm.model.kernels import declarations, isa

logger = logging.getLogger(__name__)
SOURCE_DIR = Path(__file__).parent


def sources(source_dir: Path = SOURCE_DIR) -> list[Path]:
    """The .c files, each compiled into the library."""
    return sorted(source_dir.glob("*.c"))


def headers(source_dir: Path = SOURCE_DIR) -> list[Path]:
    """kernels.h and the headers the sources include: part of the cache key."""
    return sorted(source_dir.glob("*.h"))


# Compile with -ffast-math (vectorized expf), but link without it: linking with it adds
# crtfastmath.o, which turns on flush-to-zero for the whole process at load time. An
# exported function must be declared in kernels.h (missing-prototypes).
_FLAGS = ["-O3", "-ffast-math", "-fopenmp", "-fPIC", "-Werror=missing-prototypes"]
_LINK = ["-shared", "-fopenmp", "-lm"]
_MAX_COMPILERS = 8  # compilers run at once (each GGUF source's cc1 takes ~0.5 GB)


def find_compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def compile_flags(level: str) -> list[str]:
    return [*_FLAGS, *isa.compiler_flags(level)]


def cache_dir() -> Path:
    root = os.environ.get("MINIVLLM_CACHE") or Path.home() / ".cache" / "minivllm"
    return Path(root) / "kernels"


def library_path(compiler: str, level: str, source_dir: Path = SOURCE_DIR) -> Path:
    """Where the library of this ISA level, built from these sources by this compiler,
    lives."""
    key = hashlib.sha256()
    for path in [*headers(source_dir), *sources(source_dir)]:
        key.update(path.name.encode() + b"\0" + path.read_bytes())
    key.update(" ".join([compiler, *compile_flags(level), *_LINK, platform.machine(),
                         level]).encode())
    return cache_dir() / f"minivllm-kernels-{level}-{key.hexdigest()[:16]}.so"


def _compiler_accepts(compiler: str, level: str) -> bool:
    """Whether the compiler knows the level's flags (-mavxvnni and -mamx-* need GCC 11)."""
    try:
        return subprocess.run([compiler, *compile_flags(level), "-x", "c", "-c", os.devnull,
                               "-o", os.devnull], capture_output=True).returncode == 0
    except OSError:
        return False


def _buildable_level(compiler: str, level: str, source_dir: Path) -> str:
    """The CPU's highest level, or the highest lower one whose library is cached or that
    the compiler can build (a compiler older than the CPU)."""
    have = isa.supported(isa.cpu_features())
    for candidate in reversed(have[:have.index(level) + 1]):
        if (library_path(compiler, candidate, source_dir).exists()
                or _compiler_accepts(compiler, candidate)):
            if candidate != level:
                logger.warning("%s cannot build the %s kernels (%s): using the %s ones",
                               compiler, level, " ".join(isa.LEVELS[level].flags), candidate)
            return candidate
    return level  # nothing builds: the build fails and says why


def _run(cmd: list[str]) -> bool:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        logger.warning("building the C kernels failed, using torch: %s",
                       result.stderr.strip()[:500])
    return result.returncode == 0


def _build(compiler: str, level: str, source_dir: Path, target: Path) -> bool:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            files = sources(source_dir)
            objects = [str(Path(tmp) / f"{source.stem}.o") for source in files]
            built = Path(tmp) / target.name
            commands = [[compiler, *compile_flags(level), "-c", str(source), "-o", obj]
                        for source, obj in zip(files, objects)]
            # One compiler per core: a first start (and each test that builds) waits for the
            # slowest files, not the sum of all.
            workers = min(os.cpu_count() or 1, _MAX_COMPILERS)
            with ThreadPoolExecutor(max_workers=workers) as pool:
                if not all(list(pool.map(_run, commands))):
                    return False
            if not _run([compiler, *objects, *_LINK, "-o", str(built)]):
                return False
            os.replace(built, target)  # atomic: concurrent builders never see half a file
    except OSError as exc:  # e.g. a read-only cache directory, or a compiler that cannot run
        logger.warning("cannot build the C kernels in %s, using torch: %s", target.parent, exc)
        return False
    return True


def load(source_dir: Path = SOURCE_DIR) -> SimpleNamespace | None:
    """The kernels of this CPU's highest ISA level (or MINIVLLM_ISA's) as keyword-only
    functions named as in kernels.h, built if needed, with path, isa_level, isa_features
    (what the library was compiled for) and isa_summary; or None, with a warning saying why, when
    they cannot be had. Raises isa.IsaError when MINIVLLM_ISA is not a level of this CPU."""
    level, forced = isa.select()
    compiler = find_compiler()
    if compiler is None:
        logger.warning("no C compiler found: using the pure-torch paths")
        return None
    try:
        declared = declarations.parse((source_dir / declarations.HEADER).read_text())
        target = library_path(compiler, level, source_dir)
        if not target.exists():  # checked once, before the build: its name is the sources'
            declarations.check_definitions(declared, sources(source_dir))
    except declarations.DeclarationError as exc:
        logger.warning("the C kernels do not match %s, using torch: %s", declarations.HEADER,
                       exc)
        return None
    if not target.exists() and not forced:
        level = _buildable_level(compiler, level, source_dir)
        target = library_path(compiler, level, source_dir)
    if not target.exists() and not _build(compiler, level, source_dir, target):
        return None
    try:
        lib = declarations.bind(target, declared)
    except (OSError, AttributeError) as exc:  # not a library, or one that lacks a function
        logger.warning("cannot load the C kernels from %s, using torch: %s", target, exc)
        return None
    built = isa.decode(lib.kernels_isa_features())
    lacking = [f for f in built if f not in isa.cpu_features()] if isa.is_x86() else []
    if lacking:  # not what this build makes: another file under the library's name
        logger.warning("%s was compiled for %s, which this CPU lacks: using torch", target,
                       " ".join(lacking))
        return None
    lib.isa_level, lib.isa_features = level, tuple(built)
    lib.isa_summary = summary(level, built, forced)
    logger.info("C kernels: %s", lib.isa_summary)
    return lib


def summary(level: str, built: list[str], forced: bool) -> str:
    """The start-up line's words: the level, the instruction sets the library was compiled
    for (they select the kernels' variants), and whether MINIVLLM_ISA chose it."""
    text = f"{level} ({' '.join(built) or 'baseline instructions only'})"
    if forced:
        text += f", forced by {isa.ENV} (this CPU's highest: {isa.select('')[0]})"
    return text
