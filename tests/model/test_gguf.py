"""GGUF files as models (minivllm/model/gguf.py), on a tiny random Llama written to GGUF
by tests/gguf_writer.py the way llama.cpp's converter writes it (Q/K rows permuted, tied
embeddings left out): its weights load back equal to the safetensors original's, the engine's output is
the original's, and what cannot be loaded fails naming why. The real SmolLM2 file is
tests/model/test_real_smollm2.py's."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer

from minivllm import LLM, SamplingParams
from minivllm.model import gguf as minivllm_gguf
from minivllm.model.loader import load_state_dict, resolve_model_path
from tests.gguf_writer import CHAT_TEMPLATE, write_gguf


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def tiny_gguf(tiny_llama, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf"
    write_gguf(tiny_llama, path)
    return path


def test_weights_load_back_as_the_original(tiny_llama, tmp_path, cache):
    path = tmp_path / "tiny-llama.gguf"
    q8 = "model.layers.1.mlp.up_proj.weight"  # Q8_0: close to the original, not equal
    expected = write_gguf(tiny_llama, path,
                          lambda name: GGMLQuantizationType.Q8_0 if name == q8 else None)
    directory = resolve_model_path(str(path))
    assert directory.parent == cache / "gguf"
    state = load_state_dict(directory)
    assert set(state) == set(expected)  # tied: no lm_head in either
    for name, tensor in state.items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, torch.from_numpy(expected[name])), name
    original = load_file(tiny_llama / "model.safetensors")[q8]
    assert 0 < (state[q8] - original).abs().max() < 0.02


def test_model_directory_from_metadata(tiny_llama, tiny_gguf, cache):
    directory = resolve_model_path(str(tiny_gguf))
    assert resolve_model_path(str(tiny_gguf)) == directory  # built once
    assert [p.name for p in (cache / "gguf").iterdir()] == [directory.name]
    config = AutoConfig.from_pretrained(directory)
    original = AutoConfig.from_pretrained(tiny_llama)
    assert config.architectures == ["LlamaForCausalLM"]
    for field in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "intermediate_size", "vocab_size",
                  "max_position_embeddings", "tie_word_embeddings"):
        assert getattr(config, field) == getattr(original, field), field
    generation = json.loads((directory / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, 2)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert tokenizer.convert_ids_to_tokens([1, 2, 7]) == ["<s>", "</s>", "w7"]


def test_a_changed_file_gets_a_new_directory(tiny_llama, tmp_path, cache):
    path = tmp_path / "tiny.gguf"
    write_gguf(tiny_llama, path)
    first = resolve_model_path(str(path))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert resolve_model_path(str(path)) != first


def test_engine_output_equals_the_original(tiny_llama, tiny_gguf, cache):
    prompts = [{"prompt_token_ids": [1] + [(7 * n + 13 * i) % 500 + 3 for i in range(n)]}
               for n in (3, 20, 41)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    outputs = {}
    for model in (str(tiny_llama), str(tiny_gguf)):
        # float32: a GGUF file names no dtype, so auto would be bf16 on a bf16-capable CPU
        llm = LLM(model, dtype="float32", block_size=4, num_kv_blocks=64)
        outputs[model] = [(c.token_ids, [e[t].logprob for e, t in zip(c.logprobs, c.token_ids)])
                          for c in (o.outputs[0] for o in
                                    llm.generate(prompts, params, use_tqdm=False))]
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(outputs[str(tiny_gguf)],
                                                               outputs[str(tiny_llama)]):
        assert tokens == ref_tokens
        assert logprobs == pytest.approx(ref_logprobs, abs=1e-5)


def test_explicit_tokenizer_overrides_the_files(tiny_llama, tiny_gguf, cache):
    llm = LLM(str(tiny_gguf), tokenizer=str(tiny_llama), num_kv_blocks=16)
    assert llm.get_tokenizer().chat_template is None  # the directory's, not the GGUF's
    assert llm.get_tokenizer()("w5 w9").input_ids == [5, 9]


def test_not_a_gguf_file(tmp_path, cache):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 not a gguf file")
    with pytest.raises(ValueError, match="not a GGUF file"):
        resolve_model_path(str(path))
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model_path(str(tmp_path / "missing.gguf"))


def write_bare_gguf(path, arch: str, tensors: dict[str, np.ndarray]) -> None:
    writer = GGUFWriter(path, arch)
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_unsupported_architecture_is_named(tmp_path, cache):
    path = tmp_path / "odd.gguf"
    write_bare_gguf(path, "frobnicator", {"blk.0.ffn_up.weight": np.zeros((4, 32), np.float32)})
    runs = "minivllm runs GGUF files of gemma2, gemma3, llama, mistral, phi3, qwen2, qwen3"
    with pytest.raises(ValueError, match=f"architecture 'frobnicator' is not supported; {runs}"):
        LLM(str(path))
    # transformers reads GPT-2 files; minivllm has no GPT-2 layer
    write_bare_gguf(path, "gpt2", {"token_embd.weight": np.zeros((8, 32), np.float32)})
    with pytest.raises(ValueError, match=f"architecture 'gpt2' is not supported; {runs}"):
        LLM(str(path))
    assert not list((cache / "gguf").iterdir())  # nothing half-built is left


def test_unsupported_tensor_type_is_named(tmp_path, cache):
    path = tmp_path / "int.gguf"  # gguf dequantizes no integer type
    write_bare_gguf(path, "llama", {"token_embd.weight": np.zeros((8, 32), np.float32),
                                    "blk.0.extra.weight": np.zeros((4, 4), np.int32)})
    with pytest.raises(ValueError, match="blk.0.extra.weight has GGUF type I32"):
        resolve_model_path(str(path))


@pytest.mark.parametrize("model, expected", [
    ("unsloth/Qwen3-0.6B-GGUF:Qwen3-0.6B-Q4_K_M.gguf",
     ("unsloth/Qwen3-0.6B-GGUF", "Qwen3-0.6B-Q4_K_M.gguf")),
    ("unsloth/Qwen3-0.6B-GGUF:Q4_K_M", ("unsloth/Qwen3-0.6B-GGUF", "Q4_K_M")),
])
def test_hub_form_is_split(model, expected):
    assert minivllm_gguf.is_gguf_model(model)
    assert minivllm_gguf.split_hub_gguf(model) == expected


@pytest.mark.parametrize("model", ["Qwen3-GGUF:Q4_K_M", "a/b/c:Q4_K_M", "org/repo:", "a/b:c:d"])
def test_malformed_hub_form(model):
    with pytest.raises(ValueError, match="org/repo:QUANT"):
        minivllm_gguf.split_hub_gguf(model)


def test_not_gguf_forms():
    assert not minivllm_gguf.is_gguf_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert not minivllm_gguf.is_gguf_model("minivllm-demo")


def test_quant_type_picks_one_file():
    files = ["README.md", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "m-IQ4_K_M.gguf.part"]
    assert minivllm_gguf.pick_quant_file(files, "q8_0", "org/m") == "m-Q8_0.gguf"
    with pytest.raises(ValueError, match="0 GGUF files end with 'Q5_K'"):
        minivllm_gguf.pick_quant_file(files, "Q5_K", "org/m")
    with pytest.raises(ValueError, match="2 GGUF files"):
        minivllm_gguf.pick_quant_file(files + ["n-Q8_0.gguf"], "Q8_0", "org/m")


def test_architecture_minivllm_does_not_run_is_named(tmp_path):
    # transformers reads GPT-2 from GGUF; minivllm has no GPT-2 layer
    with pytest.raises(ValueError, match="GGUF model type 'gpt2' .* is not supported"):
        minivllm_gguf.causal_lm_class("gpt2", tmp_path / "gpt2.gguf")
    assert minivllm_gguf.causal_lm_class("qwen3", tmp_path / "q.gguf") == "Qwen3ForCausalLM"
