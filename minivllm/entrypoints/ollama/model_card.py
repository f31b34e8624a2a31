"""What /api/tags, /api/show and /api/ps say about the served model, read once from its
files: a GGUF file's metadata (model_info is its key-value pairs, as Ollama's is), or a
model directory's config.json and safetensors headers (model_info in the GGUF key names, so
that a client reading `<arch>.context_length` finds it either way)."""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from minivllm.model import gguf as minivllm_gguf
from minivllm.model.loader import resolve_model_path

logger = logging.getLogger(__name__)
# Arrays longer than this (the vocabulary, merges) are left out of model_info unless
# verbose, as Ollama leaves them.
MAX_ARRAY = 64


@dataclass
class ModelCard:
    path: Path  # the GGUF file or the model directory
    format: str  # "gguf" | "safetensors"
    family: str
    parameter_count: int
    quantization_level: str
    size: int  # bytes on disk
    modified_at: str
    model_info: dict = field(default_factory=dict)
    model_info_verbose: dict = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """Not the content's hash (hashing a multi-GB file at start is not worth it): a
        stable id of the file, its size and its modification time."""
        return hashlib.sha256(f"{self.path}:{self.size}:{self.modified_at}".encode()).hexdigest()

    def details(self, parent_model: str = "") -> dict:
        return {"parent_model": parent_model, "format": self.format, "family": self.family,
                "families": [self.family], "parameter_size": human_number(self.parameter_count),
                "quantization_level": self.quantization_level}


def human_number(n: int) -> str:
    """Ollama's way of writing a parameter count: 8.0B, 494.03M."""
    for scale, unit, digits in ((1e9, "B", 1), (1e6, "M", 2), (1e3, "K", 2)):
        if n >= scale:
            return f"{n / scale:.{digits}f}{unit}"
    return str(n)


def _mtime(path: Path) -> str:
    stamp = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
    return stamp.isoformat().replace("+00:00", "Z")


def _value(field_) -> object:
    value = field_.contents()
    return value.item() if hasattr(value, "item") else value


def gguf_card(path: Path) -> ModelCard:
    from gguf import GGUFReader, LlamaFileType

    reader = GGUFReader(path)
    info, verbose = {}, {}
    for name, field_ in reader.fields.items():
        if name.startswith("GGUF."):  # the reader's own: version, counts
            continue
        value = _value(field_)
        verbose[name] = value
        info[name] = [] if isinstance(value, list) and len(value) > MAX_ARRAY else value
    count = sum(int(t.n_elements) for t in reader.tensors)
    for target in (info, verbose):
        target.setdefault("general.parameter_count", count)
    try:
        level = LlamaFileType(info["general.file_type"]).name
        level = level.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (KeyError, ValueError):  # no file type written: the type most weights are in
        types = Counter()
        for t in reader.tensors:
            types[t.tensor_type.name] += int(t.n_elements)
        level = types.most_common(1)[0][0] if types else "unknown"
    return ModelCard(path, "gguf", str(info.get("general.architecture", "unknown")), count,
                     level, path.stat().st_size, _mtime(path), info, verbose)


def _safetensors_header(path: Path) -> dict:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def directory_card(directory: Path) -> ModelCard:
    config = json.loads((directory / "config.json").read_text())
    arch = config.get("model_type", "unknown")
    count, dtypes, size = 0, Counter(), 0
    for file in sorted(directory.glob("*.safetensors")):
        size += file.stat().st_size
        for name, tensor in _safetensors_header(file).items():
            if name == "__metadata__":
                continue
            n = 1
            for dim in tensor["shape"]:
                n *= dim
            count += n
            dtypes[tensor["dtype"]] += n
    keys = {"context_length": "max_position_embeddings", "embedding_length": "hidden_size",
            "block_count": "num_hidden_layers", "feed_forward_length": "intermediate_size",
            "attention.head_count": "num_attention_heads",
            "attention.head_count_kv": "num_key_value_heads", "vocab_size": "vocab_size"}
    info = {"general.architecture": arch, "general.parameter_count": count}
    info.update({f"{arch}.{key}": config[name] for key, name in keys.items() if name in config})
    level = dtypes.most_common(1)[0][0] if dtypes else "unknown"
    return ModelCard(directory, "safetensors", arch, count, level, size,
                     _mtime(directory / "config.json"), info, info)


def read_card(model: str, revision: str | None) -> ModelCard:
    """The card of the model the engine was started with (its files are on disk by now);
    one that says "unknown" where the files cannot be read (logged): a description is not
    worth failing /api/tags for."""
    try:
        if minivllm_gguf.is_gguf_model(model):
            return gguf_card(minivllm_gguf.gguf_file(model, revision))
        return directory_card(resolve_model_path(model, revision))
    except (OSError, ValueError, KeyError, struct.error) as e:
        logger.warning("cannot read the description of %s for Ollama's API: %s", model, e)
        now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
        return ModelCard(Path(model), "unknown", "unknown", 0, "unknown", 0, now)
