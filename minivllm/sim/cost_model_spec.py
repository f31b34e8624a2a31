"""--cost-model SPEC: `roofline:PRESET` (roofline.py), `profile:PATH` (profile.py) or
`operators:PATH` (operators_model.py), as a CostModel. Apart from cost_model.py, which every
kind imports."""

from __future__ import annotations

from minivllm.sim.cost_model import CostModel
from minivllm.sim.operators_model import OperatorCostModel
from minivllm.sim.profile import ProfileCostModel
from minivllm.sim.roofline import roofline_from_preset


def load_cost_model(spec: str, model_config: str | None = None,
                    gpu_memory_utilization: float | None = None,
                    lora_rank: int = 16, kv_cache_dtype: str = "auto") -> CostModel:
    """`roofline:PRESET`, `profile:PATH` or `operators:PATH` (ValueError naming what was
    wrong), its KV cache at `kv_cache_dtype` (--kv-cache-dtype; operator tables hold for the
    dtype they were measured at, and refuse another)."""
    kind, sep, arg = spec.partition(":")
    if kind == "roofline" and sep and arg:
        return roofline_from_preset(arg, model_config, gpu_memory_utilization, lora_rank,
                                    kv_cache_dtype)
    if kind in ("profile", "operators") and sep and arg:
        if model_config is not None or gpu_memory_utilization is not None:
            raise ValueError("--model-config and --gpu-memory-utilization apply to roofline "
                             f"cost models; {kind}:PATH carries the engine it was measured on")
        if kind == "operators":
            return OperatorCostModel.load(arg, kv_cache_dtype=kv_cache_dtype)
        return ProfileCostModel.load(arg, kv_cache_dtype)
    raise ValueError(f"cost model must be roofline:PRESET, profile:PATH or operators:PATH, "
                     f"got {spec!r}")
