"""--cost-model SPEC: `roofline:PRESET` (roofline.py) or `profile:PATH` (profile.py), as a
CostModel. Apart from cost_model.py, which both kinds import."""

from __future__ import annotations

from minivllm.sim.cost_model import CostModel
from minivllm.sim.profile import ProfileCostModel
from minivllm.sim.roofline import roofline_from_preset


def load_cost_model(spec: str, model_config: str | None = None,
                    gpu_memory_utilization: float | None = None,
                    lora_rank: int = 16, kv_cache_dtype: str = "auto") -> CostModel:
    """`roofline:PRESET` or `profile:PATH` (ValueError naming what was wrong), its KV cache
    at `kv_cache_dtype` (--kv-cache-dtype)."""
    kind, sep, arg = spec.partition(":")
    if kind == "roofline" and sep and arg:
        return roofline_from_preset(arg, model_config, gpu_memory_utilization, lora_rank,
                                    kv_cache_dtype)
    if kind == "profile" and sep and arg:
        if model_config is not None or gpu_memory_utilization is not None:
            raise ValueError("--model-config and --gpu-memory-utilization apply to roofline "
                             "cost models; a profile carries the engine it was measured on")
        return ProfileCostModel.load(arg, kv_cache_dtype)
    raise ValueError(f"cost model must be roofline:PRESET or profile:PATH, got {spec!r}")
