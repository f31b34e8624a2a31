"""LoRARequest where vLLM users import it from (vllm.lora.request). It lives in
minivllm/lora_request.py, below core/, whose requests carry it."""

from minivllm.lora_request import LoRARequest

__all__ = ["LoRARequest"]
