"""minivllm: a small, readable LLM inference and serving engine in the spirit of vLLM."""

from minivllm.config import EngineConfig
from minivllm.entrypoints.llm import LLM
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "EngineConfig"]
