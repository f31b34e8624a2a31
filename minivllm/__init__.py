"""minivllm: a small, readable LLM inference and serving engine in the spirit of vLLM.

The names below are imported on first use, so that `import minivllm.core...` (the
scheduler, the simulator) never loads torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "EngineConfig"]

_HOMES = {
    "LLM": "minivllm.entrypoints.llm",
    "SamplingParams": "minivllm.sampling_params",
    "RequestOutput": "minivllm.outputs",
    "CompletionOutput": "minivllm.outputs",
    "EngineConfig": "minivllm.config",
}

if TYPE_CHECKING:
    from minivllm.config import EngineConfig
    from minivllm.entrypoints.llm import LLM
    from minivllm.outputs import CompletionOutput, RequestOutput
    from minivllm.sampling_params import SamplingParams


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'minivllm' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value
