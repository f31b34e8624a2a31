"""CPU fast paths: oneDNN linear layers (linear.py), C kernels for decode attention and
the small per-token ops (cpu.py), and the intra-op thread governor (threads.py).

Each kernel has a pure-torch reference it is tested against. MINIVLLM_DISABLE_KERNELS=1
turns them all off (the reference paths then run everywhere).
"""

from __future__ import annotations

import os


def enabled() -> bool:
    return not os.environ.get("MINIVLLM_DISABLE_KERNELS")
