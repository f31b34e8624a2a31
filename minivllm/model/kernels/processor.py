"""The CPU this process runs on, named as a benchmark figure (bench/machine.py) and the
linears' table of measured times (model/linear/choice.py) name it: its model and the ISA
flags that decide which kernels and dtypes are fast on it."""

from __future__ import annotations

import platform
from pathlib import Path

ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")


def cpu_description() -> str:
    """'Intel(R) Xeon(R) Processor, family 6 (avx2 avx512f ...)' from /proc/cpuinfo (the
    platform's processor name elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    model = next((line.partition(":")[2].strip() for line in text.splitlines()
                  if line.startswith("model name")), platform.machine())
    flags = next((line.partition(":")[2].split() for line in text.splitlines()
                  if line.startswith("flags")), [])
    family = next((line.partition(":")[2].strip() for line in text.splitlines()
                   if line.startswith("cpu family")), "?")
    return f"{model}, family {family} ({' '.join(f for f in ISA_FLAGS if f in flags) or 'no AVX2'})"
