"""CPU fast paths: the C kernels (cpu.py; the linears that run on them are model/linear/),
the instruction-set levels they are built for (isa.py), the CPU's name (processor.py), and
the intra-op thread governor (threads.py).

Each kernel has a pure-torch reference it is tested against. MINIVLLM_DISABLE_KERNELS=1
turns them all off (the reference paths then run everywhere).
"""

from __future__ import annotations

import os


def enabled() -> bool:
    return not os.environ.get("MINIVLLM_DISABLE_KERNELS")
