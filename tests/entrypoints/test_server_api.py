"""The OpenAI-compatible server, end to end: a real `minivllm serve` driven by the openai client."""

from __future__ import annotations

import httpx
import openai
import pytest

from minivllm import LLM, SamplingParams
from tests.server_utils import (
    CHAT_TEMPLATE,
    ENGINE_MODES,
    FAST_ENGINE_ARGS,
    ServerProcess,
    engine_mode_args,
    stories_model,
)

PROMPT = "Once upon a time"
KNOWN_CONTINUATION = (", there was a little girl named Lily. She loved to play outside in the "
                      "park. One day, she saw")


@pytest.fixture(scope="module", params=ENGINE_MODES)
def server(request, tmp_path_factory):
    model = stories_model()
    tmp = tmp_path_factory.mktemp("server_api")
    template = tmp / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    server = ServerProcess(model, [*FAST_ENGINE_ARGS, *engine_mode_args(request.param),
                                   "--chat-template", str(template)], tmp / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def offline():
    return LLM(model=str(stories_model()), num_kv_blocks=128, swap_space=0.05)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model_name(client):
    return client.models.list().data[0].id


def offline_generate(offline, prompt, **params):
    params.setdefault("temperature", 0.0)
    return offline.generate(prompt, SamplingParams(**params), use_tqdm=False)[0]


def test_models_health_version(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == [str(stories_model())]
    assert models[0].max_model_len == 512
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/version").json()["version"]


def test_completion_is_the_known_greedy_continuation(client, model_name):
    resp = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=32,
                                     temperature=0, user="someone",
                                     extra_body={"parallel_tool_calls": False})
    choice = resp.choices[0]
    assert choice.text == KNOWN_CONTINUATION
    assert choice.finish_reason == "length"
    assert resp.object == "text_completion"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens,
            resp.usage.total_tokens) == (5, 32, 37)


def test_completion_stream_with_and_without_usage(client, model_name):
    chunks = list(client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=32, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == KNOWN_CONTINUATION
    assert [c.usage is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 32 and chunks[-1].usage.prompt_tokens == 5
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"

    plain = list(client.completions.create(model=model_name, prompt=PROMPT, max_tokens=8,
                                           temperature=0, stream=True))
    assert all(c.usage is None and c.choices for c in plain)


def test_completion_logprobs_match_offline(client, model_name, offline):
    resp = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=10,
                                     temperature=0, logprobs=3)
    lp = resp.choices[0].logprobs
    ref = offline_generate(offline, PROMPT, max_tokens=10, logprobs=3).outputs[0]
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 10
    assert lp.token_logprobs == pytest.approx(
        [step[t].logprob for t, step in zip(ref.token_ids, ref.logprobs)], abs=1e-4)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 3 <= len(top) <= 4 and top[token] == pytest.approx(logprob)
        assert max(top.values()) == pytest.approx(logprob)  # greedy: the chosen one is the best


def test_logprob_tokens_spell_the_text(client, model_name):
    resp = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=10,
                                     temperature=0, logprobs=1)
    assert "".join(resp.choices[0].logprobs.tokens) == resp.choices[0].text


def test_echo_with_max_tokens_zero_gives_offline_prompt_logprobs(client, model_name, offline):
    # What lm-eval's local-completions sends for loglikelihood tasks.
    prompt = "Once upon a time, there was a little girl named Lily."
    resp = client.completions.create(model=model_name, prompt=prompt, max_tokens=0, echo=True,
                                     logprobs=1, temperature=0)
    choice = resp.choices[0]
    assert choice.text == prompt
    ref = offline_generate(offline, prompt, max_tokens=1, prompt_logprobs=1)
    expected = [None] + [step[t].logprob for t, step in
                         zip(ref.prompt_token_ids[1:], ref.prompt_logprobs[1:])]
    assert len(choice.logprobs.token_logprobs) == len(ref.prompt_token_ids)
    assert choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(expected[1:], abs=1e-4)
    assert resp.usage.completion_tokens == 0

    streamed = list(client.completions.create(model=model_name, prompt=prompt, max_tokens=0,
                                              echo=True, logprobs=1, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == prompt


def test_echo_with_generation(client, model_name):
    resp = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=32,
                                     temperature=0, echo=True, logprobs=0)
    assert resp.choices[0].text == PROMPT + KNOWN_CONTINUATION
    assert len(resp.choices[0].logprobs.tokens) == 5 + 32


def test_prompt_shapes(client, model_name):
    ids = [1, 403, 407, 261, 378]  # PROMPT with BOS
    for prompt in (ids, [ids, ids], [PROMPT, PROMPT + " there"]):
        resp = client.completions.create(model=model_name, prompt=prompt, max_tokens=32,
                                         temperature=0)
        assert [c.index for c in resp.choices] == list(range(len(resp.choices)))
        assert resp.choices[0].text == KNOWN_CONTINUATION
    assert len(resp.choices) == 2 and resp.usage.completion_tokens == 64
    chunks = list(client.completions.create(model=model_name, prompt=[PROMPT, PROMPT],
                                            max_tokens=32, temperature=0, stream=True))
    for index in (0, 1):
        text = "".join(c.choices[0].text for c in chunks if c.choices[0].index == index)
        assert text == KNOWN_CONTINUATION


def test_stop_strings_stream_and_not(client, model_name):
    kwargs = dict(model=model_name, prompt=PROMPT, max_tokens=32, temperature=0, stop=["Lily"])
    resp = client.completions.create(**kwargs)
    assert resp.choices[0].text == ", there was a little girl named "
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].model_extra["stop_reason"] == "Lily"
    chunks = list(client.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == ", there was a little girl named "
    kept = client.completions.create(**kwargs, extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].text.endswith("named Lily")


def test_seed_reproducible(client, model_name):
    def sample(seed):
        return client.completions.create(model=model_name, prompt=PROMPT, max_tokens=24,
                                         temperature=1.0, seed=seed).choices[0].text

    assert sample(7) == sample(7)
    assert len({sample(7), sample(8), sample(9)}) > 1


def test_vllm_extras_and_null_max_tokens(client, model_name):
    resp = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=20, temperature=0.8, top_p=0.9, seed=1,
        presence_penalty=0.5, frequency_penalty=0.5, best_of=1,
        extra_body=dict(top_k=20, min_p=0.05, repetition_penalty=1.1, min_tokens=20,
                        ignore_eos=True, stop_token_ids=[2], skip_special_tokens=True,
                        priority=0))
    assert resp.usage.completion_tokens == 20
    rest = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=None,
                                     temperature=0, extra_body={"ignore_eos": True})
    assert rest.usage.total_tokens == 512 and rest.choices[0].finish_reason == "length"


def chat_reference(offline, messages, **params):
    tokenizer = offline.get_tokenizer()
    # The server joins the text parts of a content list.
    messages = [{**m, "content": m["content"] if isinstance(m["content"], str) else
                 "\n".join(part["text"] for part in m["content"])} for m in messages]
    text = tokenizer.apply_chat_template(messages, chat_template=CHAT_TEMPLATE, tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    params.setdefault("temperature", 0.0)
    return offline.generate({"prompt_token_ids": ids}, SamplingParams(**params),
                            use_tqdm=False)[0]


MESSAGES = [{"role": "system", "content": "Tell a story."},
            {"role": "user", "content": "Once upon a time"},
            {"role": "assistant", "content": "there was a cat."},
            {"role": "user", "content": [{"type": "text", "text": "More"}]}]


def test_chat_matches_offline(client, model_name, offline):
    ref = chat_reference(offline, MESSAGES, max_tokens=24)
    resp = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=24,
                                          temperature=0)
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == ref.outputs[0].text
    assert resp.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert resp.usage.completion_tokens == len(ref.outputs[0].token_ids)
    assert resp.choices[0].finish_reason in ("stop", "length")

    newer = client.chat.completions.create(model=model_name, messages=MESSAGES, temperature=0,
                                           max_completion_tokens=5, max_tokens=50)
    assert newer.usage.completion_tokens <= 5


def test_chat_stream(client, model_name, offline):
    ref = chat_reference(offline, MESSAGES, max_tokens=24)
    chunks = list(client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].object == "chat.completion.chunk"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == ref.outputs[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(ref.prompt_token_ids)
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")


def test_chat_logprobs(client, model_name, offline):
    ref = chat_reference(offline, MESSAGES, max_tokens=6, logprobs=2).outputs[0]
    resp = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=6,
                                          temperature=0, logprobs=True, top_logprobs=2)
    content = resp.choices[0].logprobs.content
    assert len(content) == 6
    assert [c.logprob for c in content] == pytest.approx(
        [step[t].logprob for t, step in zip(ref.token_ids, ref.logprobs)], abs=1e-4)
    for entry in content:
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.top_logprobs[0].token == entry.token  # greedy
        assert bytes(entry.bytes).decode() == entry.token
    streamed = list(client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True,
        top_logprobs=2, stream=True))
    tokens = [e.token for c in streamed if c.choices and c.choices[0].logprobs
              for e in c.choices[0].logprobs.content]
    assert tokens == [c.token for c in content]
    plain = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=3)
    assert plain.choices[0].logprobs is None


def test_tokenize_and_detokenize(server, model_name):
    r = httpx.post(server.url + "/tokenize", json={"model": model_name, "prompt": PROMPT})
    assert r.json() == {"count": 5, "max_model_len": 512, "tokens": [1, 403, 407, 261, 378],
                        "token_strs": None}
    r = httpx.post(server.url + "/tokenize", json={"prompt": PROMPT, "add_special_tokens": False,
                                                   "return_token_strs": True})
    assert r.json()["tokens"] == [403, 407, 261, 378] and len(r.json()["token_strs"]) == 4
    r = httpx.post(server.url + "/tokenize", json={"messages": MESSAGES[:2]})
    assert r.json()["tokens"][0] == 1 and r.json()["count"] > 10
    r = httpx.post(server.url + "/detokenize", json={"tokens": [403, 407, 261, 378]})
    assert r.json() == {"prompt": PROMPT, "content": PROMPT}  # vLLM's key, llama-server's


def test_completion_n_choices_stream_and_not(client, model_name):
    greedy = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=32,
                                       temperature=0, n=4)
    assert [c.index for c in greedy.choices] == [0, 1, 2, 3]
    assert all(c.text == KNOWN_CONTINUATION for c in greedy.choices)
    assert greedy.usage.completion_tokens == 4 * 32 and greedy.usage.prompt_tokens == 5

    kwargs = dict(model=model_name, prompt=PROMPT, max_tokens=16, temperature=1.0, seed=3, n=3)
    whole = client.completions.create(**kwargs)
    assert len({c.text for c in whole.choices}) > 1  # each choice has its own generator
    chunks = list(client.completions.create(**kwargs, stream=True,
                                            stream_options={"include_usage": True}))
    streamed = {i: "".join(c.choices[0].text for c in chunks
                           if c.choices and c.choices[0].index == i) for i in range(3)}
    assert streamed == {c.index: c.text for c in whole.choices}
    finishes = [c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(finishes) == [0, 1, 2]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completion_n_with_several_prompts_indexes_prompt_major(client, model_name):
    resp = client.completions.create(model=model_name, prompt=[PROMPT, "One day"], n=2,
                                     max_tokens=8, temperature=0)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    assert resp.choices[0].text == resp.choices[1].text == KNOWN_CONTINUATION[:len(
        resp.choices[0].text)]
    assert resp.choices[2].text == resp.choices[3].text != resp.choices[0].text
    assert resp.usage.prompt_tokens == 5 + 3 and resp.usage.completion_tokens == 4 * 8


def test_best_of_returns_the_most_likely_of_its_samples(client, model_name):
    kwargs = dict(model=model_name, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=11)
    candidates = client.completions.create(**kwargs, n=4, logprobs=0).choices
    best = max(candidates, key=lambda c: sum(c.logprobs.token_logprobs))
    chosen = client.completions.create(**kwargs, n=1, best_of=4)
    assert [c.text for c in chosen.choices] == [best.text]
    assert chosen.choices[0].logprobs is None  # best_of's logprobs are not the client's
    two = client.completions.create(**kwargs, n=2, best_of=4, logprobs=0).choices
    ranked = sorted(candidates, key=lambda c: -sum(c.logprobs.token_logprobs))
    assert [c.text for c in two] == [c.text for c in ranked[:2]]
    assert [c.index for c in two] == [0, 1]


def test_chat_n_choices_stream_and_not(client, model_name):
    kwargs = dict(model=model_name, messages=MESSAGES, max_tokens=12, temperature=1.0, seed=5,
                  n=3)
    whole = client.chat.completions.create(**kwargs)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    chunks = list(client.chat.completions.create(**kwargs, stream=True,
                                                 stream_options={"include_usage": True}))
    roles = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == [0, 1, 2]
    streamed = {i: "".join(c.choices[0].delta.content or "" for c in chunks
                           if c.choices and c.choices[0].index == i) for i in range(3)}
    assert streamed == {c.index: c.message.content for c in whole.choices}
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert whole.usage.completion_tokens == 3 * 12 or any(
        c.finish_reason == "stop" for c in whole.choices)


def test_cache_salt_isolates_prefix_cache(server, client, model_name):
    prompt = "Tom and his dog went to the big green park near the river to play ball " * 3

    def hits_after(**extra):
        before = server.metrics()["vllm:prefix_cache_hits_total"]
        client.completions.create(model=model_name, prompt=prompt, max_tokens=1,
                                  extra_body=extra)
        return server.metrics()["vllm:prefix_cache_hits_total"] - before

    hits_after(cache_salt="tenant-a")  # fills the cache for tenant a
    assert hits_after(cache_salt="tenant-b") == 0
    assert hits_after(cache_salt="tenant-a") > 0
