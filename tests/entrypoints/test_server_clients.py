"""What common clients read from the server beyond completions: vLLM's /tokenizer_info (lm-eval's
remote tokenizer), OpenAI's usage.prompt_tokens_details.cached_tokens (aiperf), and the start-up
lines that state the KV cache's capacity."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from minivllm.config import EngineConfig
from tests.server_utils import ENGINE_MODES, ServerProcess, engine_mode_args

BLOCK = 16
# The demo model's chat template, as its tokenizer_config.json has it.
DEMO_TEMPLATE_START = "{{ bos_token }}{% for message in messages %}"


@pytest.fixture(scope="module", params=ENGINE_MODES)
def server(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server_clients")
    server = ServerProcess("minivllm-demo", ["--num-kv-blocks", "128", "--swap-space", "0.05",
                                             "--max-num-seqs", "8",
                                             *engine_mode_args(request.param)],
                           tmp / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_startup_log_states_the_kv_cache_in_tokens_and_full_length_requests(server):
    log = server.log()
    assert "KV cache size: 2,048 tokens (128 blocks of 16 tokens" in log
    # 512-token context = 32 blocks: the 128 blocks hold 4 full-length requests at once.
    assert "Maximum concurrency for 512 tokens per request: 4.00x" in log


def test_default_kv_cache_holds_max_num_seqs_full_contexts_at_most():
    # stories260K: 20 KiB per block. 4 GiB would be 209,715 blocks (3.4M tokens).
    assert EngineConfig().kv_cache_num_blocks(20480, 512) == 256 * 32
    assert EngineConfig(max_num_seqs=4).kv_cache_num_blocks(20480, 512) == 4 * 32
    assert EngineConfig(max_num_seqs=4).kv_cache_num_blocks(20480, 500) == 4 * 32  # rounds up
    # A model whose 4 GiB holds fewer blocks than that keeps the 4 GiB.
    assert EngineConfig().kv_cache_num_blocks(1 << 20, 32768) == 4096
    # An explicit size or count is taken as given.
    assert EngineConfig(kv_cache_space=1).kv_cache_num_blocks(20480, 512) == 52428
    assert EngineConfig(num_kv_blocks=7, kv_cache_space=1).kv_cache_num_blocks(20480, 512) == 7


def test_tokenizer_info_is_what_lm_eval_remote_tokenizer_reads(server):
    info = httpx.get(server.url + "/tokenizer_info").json()
    assert (info["bos_token"], info["eos_token"], info["pad_token"]) == ("<s>", "</s>", "<pad>")
    assert info["chat_template"].startswith(DEMO_TEMPLATE_START)
    assert info["tokenizer_class"] and info["model_max_length"] == 512
    assert info["added_tokens_decoder"]["2"] == "</s>"
    assert "name_or_path" not in info and "vocab_file" not in info  # the server's paths
    # lm-eval then tokenizes through /tokenize and /detokenize, special tokens by text.
    tokenize = httpx.post(server.url + "/tokenize",
                          json={"prompt": info["eos_token"], "add_special_tokens": False})
    assert tokenize.json()["tokens"] == [2]
    text = httpx.post(server.url + "/tokenize",
                      json={"prompt": "test", "add_special_tokens": False}).json()["tokens"]
    assert httpx.post(server.url + "/detokenize", json={"tokens": text}).json()["prompt"] == "test"


def test_tokenizer_info_names_the_served_chat_template_and_missing_tokens(stories_dir, tmp_path):
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    stories = ServerProcess(stories_dir, ["--num-kv-blocks", "16", "--swap-space", "0.01",
                                          "--chat-template", template], tmp_path / "server.log")
    try:
        info = httpx.get(stories.url + "/tokenizer_info").json()
    finally:
        stories.stop()
    assert info["chat_template"] == template
    assert info["pad_token"] is None and info["eos_token"] == "</s>"
    json.dumps(info)  # plain JSON all through


def _expected_cached(num_prompt_tokens: int) -> int:
    # Full blocks only, and at least one prompt token is always computed.
    return (num_prompt_tokens - 1) // BLOCK * BLOCK


PROMPT = "Once upon a time there was a little cat. " * 6


def test_cached_tokens_on_completions_whole_and_streamed(client):
    first = client.completions.create(model="minivllm-demo", prompt=PROMPT, max_tokens=4,
                                      temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = client.completions.create(model="minivllm-demo", prompt=PROMPT, max_tokens=4,
                                      temperature=0)
    cached = _expected_cached(again.usage.prompt_tokens)
    assert cached >= 3 * BLOCK
    assert again.usage.prompt_tokens_details.cached_tokens == cached
    chunks = list(client.completions.create(
        model="minivllm-demo", prompt=PROMPT, max_tokens=4, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == cached
    # Two prompts in one request: each counts its own hits.
    both = client.completions.create(model="minivllm-demo", prompt=[PROMPT, PROMPT],
                                     max_tokens=4, temperature=0)
    assert both.usage.prompt_tokens_details.cached_tokens == 2 * cached


def test_cached_tokens_on_chat_whole_and_streamed(client):
    messages = [{"role": "system", "content": PROMPT},
                {"role": "user", "content": "What does a cow say?"}]
    first = client.chat.completions.create(model="minivllm-demo", messages=messages,
                                           max_tokens=4, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = client.chat.completions.create(model="minivllm-demo", messages=messages,
                                           max_tokens=4, temperature=0)
    cached = _expected_cached(again.usage.prompt_tokens)
    assert again.usage.prompt_tokens_details.cached_tokens == cached > 0
    chunks = list(client.chat.completions.create(
        model="minivllm-demo", messages=messages, max_tokens=4, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == cached
