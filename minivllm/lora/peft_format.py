"""PEFT's LoRA adapter folder, read and checked without torch (the API server checks an
adapter before it names it; the engine core loads the tensors, lora/weights.py):
adapter_config.json and adapter_model.safetensors, tensors named
`base_model.model.model.layers.<i>.<self_attn|mlp>.<proj>.lora_<A|B>.weight`, A [r, in],
B [out, r]. The delta is B @ A scaled by lora_alpha / r (lora_alpha / sqrt(r) with
use_rslora). Anything else PEFT can express is refused by name."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

# The projections a LoRA may target, by the block that holds them.
TARGETS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
           "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_NAME = re.compile(r"base_model\.model\.(?:model\.)?layers\.(\d+)\.(self_attn|mlp)\."
                   r"(\w+)\.lora_([AB])\.weight")
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"


@dataclass(frozen=True)
class AdapterSpec:
    """A checked adapter: where its tensors are, its rank and scaling, and what it targets:
    (layer, projection) -> (A's name, B's name, A's shape, B's shape)."""

    path: Path
    rank: int
    scaling: float
    targets: dict[tuple[int, str], tuple[str, str, tuple[int, ...], tuple[int, ...]]]

    @property
    def weights_file(self) -> Path:
        return self.path / WEIGHTS_FILE


def _bad(path, why: str) -> ValueError:
    return ValueError(f"LoRA adapter {str(path)!r}: {why}")


def read_adapter(path: str | Path, max_lora_rank: int) -> AdapterSpec:
    """The adapter at `path`, or a ValueError naming what is missing or unsupported."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise _bad(path, "no such folder (a PEFT adapter folder holds adapter_config.json "
                   "and adapter_model.safetensors)")
    config = _read_config(path)
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise _bad(path, f"{CONFIG_FILE}: r must be an integer >= 1, got {rank!r}")
    if rank > max_lora_rank:
        raise _bad(path, f"rank {rank} is greater than max_lora_rank={max_lora_rank} "
                   "(--max-lora-rank)")
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise _bad(path, f"{CONFIG_FILE}: lora_alpha must be a number, got {alpha!r}")
    scaling = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    return AdapterSpec(path, rank, scaling, _read_targets(path, rank))


def _read_config(path: Path) -> dict:
    file = path / CONFIG_FILE
    if not file.is_file():
        raise _bad(path, f"{CONFIG_FILE} is missing")
    try:
        config = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad(path, f"{CONFIG_FILE} is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise _bad(path, f"{CONFIG_FILE} must hold a JSON object")
    unsupported = {
        "peft_type": config.get("peft_type", "LORA") not in ("LORA", None),
        "use_dora": bool(config.get("use_dora")),
        "modules_to_save": bool(config.get("modules_to_save")),
        "bias": config.get("bias", "none") not in ("none", None),
        "fan_in_fan_out": bool(config.get("fan_in_fan_out")),
        "rank_pattern": bool(config.get("rank_pattern")),
        "alpha_pattern": bool(config.get("alpha_pattern")),
    }
    for field, bad in unsupported.items():
        if bad:
            raise _bad(path, f"{CONFIG_FILE}: {field}={config[field]!r} is not supported "
                       "(plain LoRA only: no DoRA, no trained biases or extra modules, one "
                       "rank and alpha for every target)")
    return config


def _read_targets(path: Path, rank: int) -> dict:
    file = path / WEIGHTS_FILE
    if not file.is_file():
        other = [p.name for p in path.glob("adapter_model.*")]
        raise _bad(path, f"{WEIGHTS_FILE} is missing" + (
            f" ({', '.join(other)} found: only safetensors is read)" if other else ""))
    try:
        with safe_open(file, framework="numpy") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except Exception as e:  # safetensors' own errors: a truncated or foreign file
        raise _bad(path, f"{WEIGHTS_FILE} cannot be read ({e})") from None
    pairs: dict[tuple[int, str], dict[str, str]] = {}
    for name in shapes:
        match = _NAME.fullmatch(name)
        if match is None or TARGETS.get(match[3]) != match[2]:
            raise _bad(path, f"tensor {name!r} targets a module LoRA is not supported on "
                       f"here (supported: {', '.join(TARGETS)} of the decoder layers)")
        pairs.setdefault((int(match[1]), match[3]), {})[match[4]] = name
    if not pairs:
        raise _bad(path, f"{WEIGHTS_FILE} holds no LoRA tensors")
    targets = {}
    for key, names in sorted(pairs.items()):
        if set(names) != {"A", "B"}:
            missing = ({"A", "B"} - set(names)).pop()
            raise _bad(path, f"layer {key[0]} {key[1]}: lora_{missing} is missing")
        a, b = shapes[names["A"]], shapes[names["B"]]
        if len(a) != 2 or len(b) != 2 or a[0] != rank or b[1] != rank:
            raise _bad(path, f"layer {key[0]} {key[1]}: lora_A {list(a)} and lora_B {list(b)} "
                       f"are not [r, in] and [out, r] with r={rank}")
        targets[key] = (names["A"], names["B"], a, b)
    return targets


def projection_shapes(cfg) -> dict[str, tuple[int, int]]:
    """Each projection's (in, out) features in the model `cfg` (a transformers config)."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    hidden, q = cfg.hidden_size, cfg.num_attention_heads * head_dim
    kv, inter = cfg.num_key_value_heads * head_dim, cfg.intermediate_size
    return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
            "o_proj": (q, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}


def check_shapes(spec: AdapterSpec, cfg) -> None:
    """A ValueError unless every target fits the model `cfg` describes."""
    shapes = projection_shapes(cfg)
    for (layer, proj), (name_a, _, a, b) in spec.targets.items():
        if layer >= cfg.num_hidden_layers:
            raise _bad(spec.path, f"{name_a} is for layer {layer}, the model has "
                       f"{cfg.num_hidden_layers}")
        if (a[1], b[0]) != shapes[proj]:
            raise _bad(spec.path, f"{proj} of layer {layer} maps {a[1]} -> {b[0]} features, "
                       f"the model's {shapes[proj][0]} -> {shapes[proj][1]}: an adapter for "
                       "another model?")
