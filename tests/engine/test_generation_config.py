"""The model's sampling defaults (generation_config.json), as vLLM's --generation-config:
offline (LLM.get_default_sampling_params, generate without params) and through the server
(a field the request leaves unset takes the model's value; an explicit one wins)."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from minivllm import LLM, SamplingParams
from minivllm.cli import main
from minivllm.config import EngineConfig
from minivllm.engine.generation_defaults import load_sampling_defaults
from tests.model_factory import save_tiny_model
from tests.server_utils import CHAT_TEMPLATE, FAST_ENGINE_ARGS, ServerProcess

# A Qwen2.5-style recommendation, but greedy, so that the model's default is observable.
RECOMMENDED = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False, "temperature": 0.0,
               "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05, "max_new_tokens": 5}
PROMPT = "w5 w6 w7 w8"


def write_generation_config(directory, config: dict) -> None:
    (directory / "generation_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = save_tiny_model("llama", tmp_path_factory.mktemp("genconfig") / "model")
    write_generation_config(directory, RECOMMENDED)
    return directory


def defaults(model, **kwargs) -> dict:
    return load_sampling_defaults(EngineConfig(model=str(model), **kwargs))[0]


# ---- reading the file --------------------------------------------------------------------


def test_the_files_keys_become_sampling_defaults(model_dir):
    assert defaults(model_dir) == {"temperature": 0.0, "top_p": 0.8, "top_k": 20,
                                   "repetition_penalty": 1.05, "max_tokens": 5}


def test_only_keys_the_file_sets_count_and_do_sample_is_ignored(tmp_path):
    # transformers' GenerationConfig would add top_k=50 and friends; do_sample alone is no
    # recommendation, and do_sample=false does not make a temperature greedy (vLLM's reading)
    write_generation_config(tmp_path, {"do_sample": False, "eos_token_id": 2})
    assert defaults(tmp_path) == {}
    write_generation_config(tmp_path, {"do_sample": False, "temperature": 0.6, "top_p": 0.9,
                                       "top_k": 0, "min_p": None})
    assert defaults(tmp_path) == {"temperature": 0.6, "top_p": 0.9, "top_k": -1}


def test_no_file_and_the_demo_model_give_no_defaults(tmp_path):
    assert defaults(tmp_path) == {}
    assert defaults("minivllm-demo") == {}


def test_a_bad_value_in_the_models_file_is_skipped_with_a_warning(tmp_path, caplog):
    write_generation_config(tmp_path, {"temperature": 0.7, "top_p": 0.0, "top_k": "x"})
    with caplog.at_level(logging.WARNING):
        assert defaults(tmp_path) == {"temperature": 0.7}
    assert "top_p" in caplog.text and "top_k" in caplog.text


def test_vllm_ignores_the_file_and_a_folder_path_reads_another(model_dir, tmp_path):
    assert defaults(model_dir, generation_config="vllm") == {}
    write_generation_config(tmp_path, {"temperature": 0.3})
    assert defaults(model_dir, generation_config=str(tmp_path)) == {"temperature": 0.3}
    with pytest.raises(ValueError, match="--generation-config.*'auto', 'vllm' or a folder"):
        EngineConfig(generation_config=str(tmp_path / "nowhere"))


def test_override_merges_over_the_file_and_null_removes_a_key(model_dir):
    got = defaults(model_dir, override_generation_config={"temperature": 0.5, "top_k": None})
    assert got == {"temperature": 0.5, "top_p": 0.8, "repetition_penalty": 1.05,
                   "max_tokens": 5}
    # with 'vllm', the override is all there is; a JSON string works as well as a dict
    assert defaults(model_dir, generation_config="vllm",
                    override_generation_config='{"min_p": 0.1}') == {"min_p": 0.1}


@pytest.mark.parametrize("value, message", [
    ("{temperature: 1}", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"temprature": 0.5}', "unknown key.*'temprature'.*known: temperature"),
    ('{"top_p": 2}', "top_p.*must be in"),
    ('{"top_k": 1.5}', "top_k.*integer"),
    ('{"temperature": "hot"}', "temperature.*number"),
])
def test_a_bad_override_is_a_clear_error_naming_the_flag(value, message):
    with pytest.raises(ValueError, match="--override-generation-config.*" + message):
        EngineConfig(override_generation_config=value)


def test_the_cli_refuses_a_bad_override_before_loading_anything(model_dir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", str(model_dir), "--override-generation-config", '{"temperature": '])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --override-generation-config: not valid JSON" in err


# ---- offline -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(str(model_dir), num_kv_blocks=64, swap_space=0.01)


def test_get_default_sampling_params_and_generate_without_params(llm):
    params = llm.get_default_sampling_params()
    assert (params.temperature, params.top_p, params.top_k, params.min_p,
            params.repetition_penalty, params.max_tokens) == (0.0, 0.8, 20, 0.0, 1.05, 5)
    [default] = llm.generate(PROMPT, use_tqdm=False)
    explicit = SamplingParams(temperature=0.0, top_p=0.8, top_k=20, repetition_penalty=1.05,
                              max_tokens=5)
    [expected] = llm.generate(PROMPT, explicit, use_tqdm=False)
    assert default.outputs[0].token_ids == expected.outputs[0].token_ids
    assert len(default.outputs[0].token_ids) == 5


def test_vllm_mode_offline_uses_sampling_params_defaults(model_dir):
    llm = LLM(str(model_dir), num_kv_blocks=16, swap_space=0.01, generation_config="vllm",
              override_generation_config={"max_new_tokens": 3})
    assert llm.get_default_sampling_params() == SamplingParams(max_tokens=3)


# ---- the server ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = tmp_path_factory.mktemp("genconfig_template") / "chat.jinja"
    path.write_text(CHAT_TEMPLATE)
    return path


@pytest.fixture(scope="module")
def server(model_dir, template, tmp_path_factory):
    server = ServerProcess(model_dir, [*FAST_ENGINE_ARGS, "--chat-template", str(template)],
                           tmp_path_factory.mktemp("genconfig_server") / "server.log")
    yield server
    server.stop()


def complete(server, **body) -> dict:
    r = httpx.post(server.url + "/v1/completions",
                   json={"prompt": PROMPT, "ignore_eos": True, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_server_logs_the_defaults_in_force(server):
    log = server.log()
    assert "Default sampling parameters overridden by the model's generation config" in log
    assert "temperature=0.0, top_p=0.8, top_k=20, repetition_penalty=1.05, max_tokens=5" in log


def test_server_request_without_a_field_gets_the_models_value(server):
    greedy = complete(server, temperature=0, top_p=0.8, top_k=20, repetition_penalty=1.05,
                      max_tokens=5)["choices"][0]["text"]
    unset = complete(server, max_tokens=5)["choices"][0]["text"]
    null = complete(server, max_tokens=5, temperature=None, top_k=None)["choices"][0]["text"]
    assert unset == null == greedy
    # an explicit value wins: temperature 1 with a seed is what the engine gives it
    sampled = [complete(server, max_tokens=5, temperature=1.0, top_k=-1, top_p=1.0,
                        repetition_penalty=1.0, seed=s)["choices"][0]["text"] for s in range(4)]
    assert any(text != greedy for text in sampled)


def test_server_max_new_tokens_caps_max_tokens_as_in_vllm(server):
    assert complete(server, max_tokens=16)["usage"]["completion_tokens"] == 5
    assert complete(server, max_tokens=3)["usage"]["completion_tokens"] == 3
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": PROMPT}], "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 5  # the rest of the context, capped


def test_server_generation_config_vllm_ignores_the_file(model_dir, template, tmp_path):
    server = ServerProcess(model_dir, [*FAST_ENGINE_ARGS, "--generation-config", "vllm",
                                       "--override-generation-config", '{"top_k": 7}'],
                           tmp_path / "server.log")
    try:
        assert "overridden by --override-generation-config: top_k=7" in server.log()
        explicit = complete(server, max_tokens=8, temperature=1.0, top_p=1.0, top_k=7,
                            repetition_penalty=1.0, seed=3)
        unset = complete(server, max_tokens=8, seed=3)
        assert unset["choices"][0]["text"] == explicit["choices"][0]["text"]
        assert unset["usage"]["completion_tokens"] == 8  # no max_new_tokens cap
    finally:
        server.stop()
