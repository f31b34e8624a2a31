"""Find a model (local directory, the built-in demo, or a hub id) and read its weights."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import torch
from safetensors.torch import load_file

from minivllm.config import DEMO_MODEL_NAME

_DTYPES = {
    "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "float16": torch.float16, "half": torch.float16,
}


def resolve_model_path(model: str, revision: str | None = None) -> Path:
    """A local directory as is; 'minivllm-demo' from the installed package; anything else
    is a Hugging Face hub id, downloaded (or found in the local HF cache) by huggingface_hub."""
    if model == DEMO_MODEL_NAME:
        return Path(str(resources.files("minivllm") / "demo_model"))
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    allow = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]
    try:
        return Path(snapshot_download(model, revision=revision, allow_patterns=allow))
    except Exception as exc:  # offline, unknown repo, bad id: all mean "cannot load"
        raise ValueError(
            f"model {model!r} is neither a local directory nor a loadable hub id: {exc}"
        ) from exc


def resolve_dtype(dtype: str, hf_config) -> torch.dtype:
    if dtype == "auto":
        configured = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
        if isinstance(configured, str):
            configured = _DTYPES.get(configured)
        return configured if isinstance(configured, torch.dtype) else torch.float32
    return _DTYPES[dtype]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of model.safetensors, or of every shard listed in its index.json."""
    single = path / "model.safetensors"
    if single.exists():
        return load_file(single)
    index = path / "model.safetensors.index.json"
    if not index.exists():
        raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path}")
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(path / shard))
    return state
