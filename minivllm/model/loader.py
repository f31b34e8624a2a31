"""Find a model (local directory, the built-in demo, a GGUF file, or a hub id) and read its
weights."""

from __future__ import annotations

import json
import logging
import resource
import sys
import time
from importlib import resources
from pathlib import Path

import torch
from safetensors.torch import load_file

from minivllm.config import DEMO_MODEL_NAME
from minivllm.model import gguf
from minivllm.model.kernels import library
from minivllm.model.kernels.isa import cpu_features, native_bf16

logger = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "float16": torch.float16, "half": torch.float16,
}


def resolve_model_path(model: str, revision: str | None = None) -> Path:
    """A local directory as is; 'minivllm-demo' from the installed package; a GGUF file
    (a path, or a hub 'org/repo:file.gguf' / 'org/repo:QUANT') as the directory built from
    its metadata (model/gguf.py); anything else is a Hugging Face hub id, downloaded (or
    found in the local HF cache) by huggingface_hub."""
    if model == DEMO_MODEL_NAME:
        return Path(str(resources.files("minivllm") / "demo_model"))
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if gguf.is_gguf_model(model):
        return gguf.model_dir(gguf.gguf_file(model, revision))
    from huggingface_hub import snapshot_download

    allow = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]
    try:
        return Path(snapshot_download(model, revision=revision, allow_patterns=allow))
    except Exception as exc:  # offline, unknown repo, bad id: all mean "cannot load"
        raise ValueError(
            f"model {model!r} is neither a local directory nor a loadable hub id: {exc}"
        ) from exc


def resolve_dtype(dtype: str, hf_config, device: torch.device | None = None) -> torch.dtype:
    """An explicit dtype as named. "auto": the checkpoint's dtype (float32 if it names none),
    except on the CPU (`device`), where a float32 checkpoint stays float32 (exact, the
    reference) and any other (bf16, fp16, or none named: a GGUF file) runs in bfloat16 where
    the CPU has native bf16 dot products (AVX512-BF16, AMX-BF16). Without them a bf16
    checkpoint keeps its bf16 weights where the CPU has AVX2 (panel_gemm.c: fp32 arithmetic
    on the stored values, exact, half fp32's bytes) and the rest runs in float32."""
    if dtype != "auto":
        return _DTYPES[dtype]
    configured = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(configured, str):
        configured = _DTYPES.get(configured)
    if device is None or device.type != "cpu":
        return configured if isinstance(configured, torch.dtype) else torch.float32
    if configured == torch.float32:
        return torch.float32
    native = native_bf16(cpu_features())
    stored = (not native and configured == torch.bfloat16 and "avx2" in cpu_features()
              and library.enabled())
    logger.info("dtype auto on this CPU: %s (the checkpoint: %s; %s)",
                "bfloat16" if native or stored else "float32", configured or "no dtype named",
                "native bf16 dot products" if native else
                "bf16 weights as stored, fp32 arithmetic" if stored else
                "no AVX512-BF16 / AMX-BF16: bf16 arithmetic would be emulated")
    return torch.bfloat16 if native or stored else torch.float32


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_state_dict(path: Path, keep_gguf_blocks: bool = False) -> dict[str, torch.Tensor]:
    """All tensors of the model directory, logging how long that took and the process's
    peak memory so far. keep_gguf_blocks: see gguf.load_gguf_state_dict."""
    start = time.perf_counter()
    from_gguf = gguf.is_gguf_dir(path)
    state = (gguf.load_gguf_state_dict(path, keep_gguf_blocks) if from_gguf
             else _load_safetensors(path))
    logger.info("Loading weights took %.2f s (%s); peak memory %.0f MiB",
                time.perf_counter() - start, "GGUF" if from_gguf else "safetensors",
                peak_rss_mib())
    return state


def peak_rss_mib() -> float:
    """This process's peak resident memory: Linux's VmHWM, else ru_maxrss (which on Linux
    also counts the parent's peak before exec: a process started by a large one)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / (1 << 20) if sys.platform == "darwin" else maxrss / 1024  # B / KiB


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
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
