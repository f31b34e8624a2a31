"""What a benchmark figure must name: the CPU model and the ISA flags that decide which
kernels and dtypes are fast on it (cpu_description, kept beside the kernels, whose table of
measured times names the CPU too), and the load it ran under."""

from __future__ import annotations

import os
from datetime import datetime, timezone

from minivllm.model.kernels.processor import cpu_description

__all__ = ["cpu_description", "when_and_load"]


def when_and_load() -> str:
    """'2026-11-27 11:20 UTC, load average 0.96 0.92 1.00'"""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{now}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
