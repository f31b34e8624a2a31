"""GGUF files (llama.cpp's format) as models: the file's metadata becomes a small model
directory the engine reads like any other (config.json, generation_config.json, the
tokenizer with its chat template), and its tensors are dequantized to float32 at load (with
`quantization="gguf"`, linear weights and token embeddings of the block types the kernels run
stay the file's blocks; a tied LM head runs from the embeddings' blocks).

Both halves are transformers' GGUF support (metadata -> config and tokenizer; tensor names
and llama.cpp's Q/K permutation undone) over the `gguf` package's reader and dequantizers;
this module adds the cache directory, the checks that name what we cannot load, and the
`repo_id:file.gguf` / `repo_id:QUANT` forms of a hub file (vLLM's).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

from minivllm.model.gguf_bytes import Tensor, WeightBytes
from minivllm.model.gguf_config import complete_config
from minivllm.model.kernels.gguf_blocks import UNIT_BYTES
from minivllm.model.linear.gguf import BlockWeight

logger = logging.getLogger(__name__)
# The pointer from a cache directory to its GGUF file; load_state_dict looks for it.
POINTER = "gguf_file.json"
# What the directory holds; a directory built by an older minivllm is built again.
DIR_FORMAT = 3  # 2: the tensor index (where each tensor lies in the file); 3: gguf_config
_MAGIC = b"GGUF"


def is_gguf_model(model: str) -> bool:
    """A path to a .gguf file, or a hub `repo_id:file.gguf` / `repo_id:QUANT` (hub repo
    ids have no ':', so a colon can only mean the GGUF form)."""
    return model.endswith(".gguf") or (":" in model and not Path(model).expanduser().exists())


def split_hub_gguf(model: str) -> tuple[str, str]:
    """'org/repo:file.gguf' or 'org/repo:Q4_K_M' -> (repo id, file name or quant type)."""
    repo_id, _, file_or_quant = model.partition(":")
    if repo_id.count("/") != 1 or not file_or_quant or ":" in file_or_quant:
        raise ValueError(f"model {model!r}: a GGUF file on the hub is written "
                         "'org/repo:file.gguf' or 'org/repo:QUANT' (e.g. Q4_K_M)")
    return repo_id, file_or_quant


def pick_quant_file(files: list[str], quant: str, repo_id: str) -> str:
    """The one .gguf file of a repo whose name ends with the quant type (case-insensitive)."""
    matches = [f for f in files
               if f.lower().endswith(".gguf") and f.lower()[:-5].endswith(quant.lower())]
    if len(matches) != 1:
        ggufs = [f for f in files if f.lower().endswith(".gguf")]
        raise ValueError(f"{repo_id}:{quant}: {len(matches)} GGUF files end with {quant!r} "
                         f"(need exactly one; the repo has {ggufs}); name the file instead")
    return matches[0]


def gguf_file(model: str, revision: str | None = None) -> Path:
    """The local GGUF file a model string names, downloaded with huggingface_hub if a hub
    form; ValueError if there is no such file."""
    path = Path(model).expanduser()
    if path.is_file():
        return path.resolve()
    if model.endswith(".gguf") and ":" not in model:
        raise ValueError(f"GGUF file {model!r} does not exist")
    repo_id, file_or_quant = split_hub_gguf(model)
    from huggingface_hub import hf_hub_download, list_repo_files

    try:
        filename = (file_or_quant if file_or_quant.lower().endswith(".gguf") else
                    pick_quant_file(list_repo_files(repo_id, revision=revision),
                                    file_or_quant, repo_id))
        return Path(hf_hub_download(repo_id, filename, revision=revision))
    except ValueError:
        raise
    except Exception as exc:  # offline, unknown repo or file: all mean "cannot load"
        raise ValueError(f"model {model!r}: cannot get the GGUF file from the hub: {exc}") from exc


def cache_root() -> Path:
    base = os.environ.get("MINIVLLM_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "minivllm") / "gguf"


def model_dir(path: Path) -> Path:
    """The model directory built from a GGUF file's metadata, once per file version (its
    absolute path, size and mtime) and DIR_FORMAT. Built in a temporary directory renamed
    into place, so processes that start together (a server's front end and engine core)
    never see half."""
    stat = path.stat()
    key = hashlib.sha256(
        f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{DIR_FORMAT}".encode()).hexdigest()
    target = cache_root() / f"{path.stem}-{key[:16]}"
    if (target / POINTER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".building-"))
    try:
        _write_model_dir(path, tmp)
        os.rename(tmp, target)
    except OSError:
        if not (target / POINTER).exists():  # not a lost race with another builder
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _write_model_dir(path: Path, out: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    arch = check_loadable(path)
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    complete_config(config, open_gguf(path), arch)
    config.architectures = [causal_lm_class(config.model_type, path)]
    config.save_pretrained(out)
    GenerationConfig(bos_token_id=config.bos_token_id,
                     eos_token_id=config.eos_token_id).save_pretrained(out)
    AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(out)
    (out / POINTER).write_text(json.dumps({
        "gguf_file": str(path), "architecture": arch,
        "tensor_names": _tensor_names(config, arch), "tensors": _tensor_index(path)}, indent=1))


def _tensor_index(path: Path) -> list[dict]:
    """Where each tensor's data lies in the file, with its type and array shape: loading
    then maps the file and slices it, instead of parsing every metadata field again (the
    vocabulary and merges: 1.2 s of SmolLM2's start)."""
    return [{"name": t.name, "type": int(t.tensor_type), "offset": int(t.data_offset),
             "dtype": t.data.dtype.str, "shape": list(t.data.shape)}
            for t in open_gguf(path).tensors]


def _processor(config, arch: str):
    """transformers' per-architecture fix-ups of GGUF tensors (llama.cpp's Q/K
    permutation undone, experts stacked)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    return TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())


def _tensor_names(config, arch: str) -> dict[str, str]:
    """GGUF tensor name -> transformers checkpoint name: transformers' map, from a model
    of the config built on the meta device (no memory). Kept in the cache directory, so
    that loading imports no transformers model code (2 s)."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    # The whole model's names only: get_gguf_hf_weights_map also maps every submodule's
    # relative names (for checkpoints saved from a base model, e.g. Bloom), building a
    # gguf name table per submodule: 10 s on SmolLM2's 397 modules, none of them needed.
    top_level = SimpleNamespace(config=config, state_dict=skeleton.state_dict,
                                named_children=list)
    return get_gguf_hf_weights_map(top_level, _processor(config, arch))


def check_loadable(path: Path) -> str:
    """The file's GGUF architecture; ValueError naming what we cannot load: not a GGUF
    file, an architecture we do not run (naming those we do), a tensor type that the gguf
    package cannot dequantize."""
    with open(path, "rb") as f:
        if f.read(4) != _MAGIC:
            raise ValueError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    reader = open_gguf(path)
    from gguf import GGMLQuantizationType
    from gguf.quants import _type_traits  # the block types gguf.quants can dequantize

    field = reader.fields.get("general.architecture")
    arch = field.contents() if field is not None else None
    runnable = runnable_architectures()
    if arch not in runnable:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported; minivllm runs "
                         f"GGUF files of {', '.join(runnable)}")
    readable = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, *_type_traits}
    for tensor in reader.tensors:
        if tensor.tensor_type not in readable:
            raise ValueError(f"{path}: tensor {tensor.name} has GGUF type "
                             f"{tensor.tensor_type.name}, which cannot be dequantized")
    return arch


# A file's general.architecture -> transformers' name for it, where they differ
_TRANSFORMERS_NAMES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}
# transformers' GGUF architecture -> the model type its config gets, where they differ
_MODEL_TYPES = {"gemma3": "gemma3_text", "gemma4": "gemma4_text"}


def runnable_architectures() -> list[str]:
    """The GGUF architectures (as files name them) that transformers reads and minivllm
    runs."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from minivllm.model.models import ARCHITECTURES

    file_names = {name: file for file, name in _TRANSFORMERS_NAMES.items()}
    return sorted(file_names.get(name, name) for name in GGUF_SUPPORTED_ARCHITECTURES
                  if MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(_MODEL_TYPES.get(name, name))
                  in ARCHITECTURES)


def causal_lm_class(model_type: str, path: Path) -> str:
    """config.json's `architectures` entry for a model type, if minivllm runs it."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from minivllm.model.models import ARCHITECTURES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if name not in ARCHITECTURES:
        raise ValueError(f"{path}: GGUF model type {model_type!r} ({name}) is not supported; "
                         f"minivllm runs {', '.join(ARCHITECTURES)}")
    return name


def is_gguf_dir(directory: Path) -> bool:
    """A directory built by model_dir (its weights are in the GGUF file it points to)."""
    return (directory / POINTER).exists()


def load_gguf_state_dict(directory: Path, keep_blocks: bool = False
                         ) -> dict[str, torch.Tensor | BlockWeight]:
    """The tensors of the GGUF file a model_dir points to, under transformers' checkpoint
    names, dequantized to float32: transformers' load_gguf_checkpoint, less its parsing of
    every metadata field into Python values (the vocabulary and merges: seconds; the
    directory has them) and its name map (kept in the directory).

    keep_blocks (`quantization="gguf"`): the linear weights and the token embeddings stored
    as a block type the kernels run (kernels/gguf_blocks.py) come back as their blocks
    (BlockWeight, linear/gguf.py), not dequantized; the rest as above. Looked up,
    the embeddings' rows are dequantized; a tied LM head runs from their blocks. The start
    log (gguf_bytes.py) says which tensors run in which type, and the bytes of weights a
    decode step reads; a linear dequantized under keep_blocks is a warning saying what it
    costs."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize
    from transformers import AutoConfig

    pointer = json.loads((directory / POINTER).read_text())
    names = pointer["tensor_names"]
    processor = _processor(AutoConfig.from_pretrained(directory), pointer["architecture"])
    parsed: dict = {"tensors": {}}  # where the expert processors put what they stack
    state: dict[str, torch.Tensor | BlockWeight] = parsed["tensors"]
    # copy-on-write: the blocks are views of the file, never copied (the kernels only read
    # them; repacked, or found in the repack cache, most are never read at all)
    mapped = np.memmap(pointer["gguf_file"], mode="c").view(np.ndarray)
    report = WeightBytes()
    for tensor in pointer["tensors"]:
        dtype, shape = np.dtype(tensor["dtype"]), tensor["shape"]
        data = mapped[tensor["offset"]:tensor["offset"] + dtype.itemsize * math.prod(shape)]
        qtype = GGMLQuantizationType(tensor["type"])
        matrix = len(shape) == 2  # a linear's weight or the embeddings (3-D: experts)
        why_not = _why_not_blocks(qtype, processor)
        as_blocks = keep_blocks and matrix and not why_not
        # Blocks run along the input dimension, so a processor's row permutation (llama.cpp's
        # Q/K order undone) moves whole rows of bytes as it moves rows of values.
        weights = (data.view(dtype).reshape(shape) if as_blocks else
                   dequantize(data.view(dtype).reshape(shape), qtype))
        result = processor.process(weights=weights, name=tensor["name"],
                                   tensor_key_mapping=names, parsed_parameters=parsed)
        if result.name in names:  # not e.g. llama.cpp's precomputed rope_freqs
            weights = torch.from_numpy(result.weights)
            state[names[result.name]] = (BlockWeight(int(qtype), weights, tensor["name"])
                                         if as_blocks else weights)
            block_values, type_bytes = GGML_QUANT_SIZES[qtype]
            report.add(Tensor(tensor["name"], qtype.name, int(qtype), matrix,
                              data.nbytes // type_bytes * block_values, data.nbytes,
                              as_blocks, why_not if matrix else ""))
    report.log(keep_blocks)
    return state


def _why_not_blocks(qtype, processor) -> str:
    """Why a matrix of this type cannot run from its blocks ("" if it can): a type the
    kernels do not run, or a processor other than transformers' default, Llama's Q/K
    un-permutation or Gemma's (its 1 + weight undone on norm vectors only): the others
    change a matrix's values."""
    from transformers.modeling_gguf_pytorch_utils import (
        Gemma2TensorProcessor,
        LlamaTensorProcessor,
        TensorProcessor,
    )

    if int(qtype) not in UNIT_BYTES:
        return "a type the kernels do not run"
    if type(processor) not in (TensorProcessor, LlamaTensorProcessor, Gemma2TensorProcessor):
        return f"transformers' {type(processor).__name__} rewrites the values"
    return ""


def open_gguf(path: Path):
    """gguf's GGUFReader (metadata parsed, tensors memory-mapped), over a plain-ndarray
    view of its map: it slices the map once per metadata element (a 49k-token vocabulary
    and its merges), and np.memmap's slicing hooks made that 3x slower (2.4 s -> 0.8 s on
    SmolLM2's file)."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise ImportError("loading a GGUF file needs the gguf package: "
                          "pip install 'minivllm[gguf]'") from exc
    import numpy as np

    class PlainArrayReader(GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._data

        @data.setter
        def data(self, mapped: np.ndarray) -> None:
            self._data = mapped.view(np.ndarray)

    return PlainArrayReader(path)
