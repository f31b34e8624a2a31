"""PEFT's adapter folder read without torch: rank, scaling (rslora too), targets, and every
unsupported or broken part refused by name; the server's registry and its permission."""

from __future__ import annotations

import math

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from transformers import AutoConfig

from minivllm.entrypoints.openai.errors import install_error_handlers
from minivllm.entrypoints.openai.models.routes import add_lora_routes
from minivllm.entrypoints.openai.models.serving import (
    OpenAIServingModels,
    parse_lora_module,
    runtime_updating_allowed,
)
from minivllm.lora.peft_format import check_shapes, read_adapter
from tests.lora_utils import edit_config, make_adapter


@pytest.fixture(scope="module")
def adapter(stories_dir, tmp_path_factory):
    return make_adapter(stories_dir, tmp_path_factory.mktemp("peft") / "a", seed=0, rank=4)


def test_rank_scaling_and_targets(adapter, stories_dir):
    spec = read_adapter(adapter, max_lora_rank=16)
    cfg = AutoConfig.from_pretrained(stories_dir)
    assert spec.rank == 4 and spec.scaling == 8 / 4  # lora_alpha = 2 r
    assert len(spec.targets) == 7 * cfg.num_hidden_layers
    check_shapes(spec, cfg)
    edit_config(adapter, use_rslora=True)
    try:
        assert read_adapter(adapter, 16).scaling == pytest.approx(8 / math.sqrt(4))
    finally:
        edit_config(adapter, use_rslora=False)


@pytest.mark.parametrize("change, words", [
    ({"use_dora": True}, "use_dora=True is not supported"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"bias": "all"}, "bias='all'"),
    ({"peft_type": "IA3"}, "peft_type='IA3'"),
    ({"r": 32}, "rank 32 is greater than max_lora_rank=16"),
    ({"lora_alpha": "x"}, "lora_alpha must be a number"),
])
def test_unsupported_configs_are_named(adapter, tmp_path, change, words):
    import shutil

    copy = shutil.copytree(adapter, tmp_path / "copy")
    edit_config(copy, **change)
    with pytest.raises(ValueError, match=words):
        read_adapter(copy, max_lora_rank=16)


def test_embedding_targets_bin_files_and_other_models_are_refused(stories_dir, tmp_path,
                                                                   adapter, tiny_llama):
    embed = make_adapter(stories_dir, tmp_path / "embed", seed=1, targets=("embed_tokens",))
    with pytest.raises(ValueError, match="embed_tokens.*not supported"):
        read_adapter(embed, 16)
    (bin_only := tmp_path / "bin").mkdir()
    (bin_only / "adapter_config.json").write_text('{"r": 4}')
    (bin_only / "adapter_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="only safetensors is read"):
        read_adapter(bin_only, 16)
    with pytest.raises(ValueError, match="another model"):
        check_shapes(read_adapter(adapter, 16), AutoConfig.from_pretrained(tiny_llama))


def test_lora_modules_spellings():
    assert parse_lora_module("a=/x").path == "/x"
    module = parse_lora_module('{"name": "a", "path": "/x", "base_model_name": "b"}')
    assert (module.name, module.base_model_name) == ("a", "b")
    for bad in ("a", "=/x", '{"name": "a"}', "{oops"):
        with pytest.raises(ValueError, match="--lora-modules"):
            parse_lora_module(bad)


def test_runtime_updating_is_off_unless_allowed(adapter, monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    assert not runtime_updating_allowed(False)
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    assert runtime_updating_allowed(False)
    app = FastAPI()
    install_error_handlers(app)
    models = OpenAIServingModels("base", "base", 128, None, 16)
    add_lora_routes(app, models, allowed=False)
    reply = TestClient(app).post("/v1/load_lora_adapter",
                                 json={"lora_name": "a", "lora_path": str(adapter)})
    assert reply.status_code == 403 and "--allow-runtime-lora-updating" in reply.text
    assert not models.lora_requests


def test_a_server_without_enable_lora_refuses_adapters(adapter):
    models = OpenAIServingModels("base", "base", 128)
    with pytest.raises(ValueError, match="--enable-lora"):
        models.load("a", str(adapter))
