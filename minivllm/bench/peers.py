"""The peers minivllm is measured against, installed by scripts/install_peers.sh into the
checkout's peers/ folder (git-ignored), each in a venv of its own: their pythons, and the
environment vLLM's CPU build runs in."""

from __future__ import annotations

import os
from pathlib import Path


def peer_python(root: Path, peer: str) -> Path:
    """The python of peers/<peer> (llamacpp, vllm) in the checkout at `root`."""
    return root / "peers" / peer / "bin" / "python"


# vLLM's CPU guide preloads tcmalloc beside Intel's OpenMP (scripts/install_peers.sh installs
# it from Debian); where it is missing vLLM runs without it and warns so
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")


def vllm_env(root: Path) -> dict[str, str]:
    preload = [root / "peers" / "vllm" / "lib" / "libiomp5.so"]
    if TCMALLOC.exists():
        preload.insert(0, TCMALLOC)
    return {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "2",
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{os.cpu_count() - 1}",
            "LD_PRELOAD": ":".join(str(p) for p in preload)}
