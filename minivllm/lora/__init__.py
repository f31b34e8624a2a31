"""LoRA adapters served on one base model: the request (request.py), PEFT's files read and
checked without torch (peft_format.py), and the engine core's side (weights.py, layers.py,
manager.py: the weights, the batched per-adapter delta, the loaded set)."""

from minivllm.lora.request import LoRARequest

__all__ = ["LoRARequest"]
