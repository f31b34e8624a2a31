"""POST /v1/responses, GET and DELETE /v1/responses/{id} through a real `minivllm serve` on
the stories model, with the official openai client: a response is the chat completion of the
same conversation (greedy: the same text and token counts), whole and as typed events the SDK
parses; text.format json_schema; a function tool round trip through previous_response_id;
reasoning items with a reasoning parser; the store; bad input named in a 400."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from minivllm.cli import main
from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.responses.protocol import ResponseObject, ResponsesRequest
from minivllm.entrypoints.openai.responses.serving import OpenAIServingResponses
from minivllm.entrypoints.openai.responses.store import ResponseStore, StoredResponse
from tests.server_utils import CHAT_TEMPLATE, FAST_ENGINE_ARGS, ServerProcess, stories_model

pytestmark = pytest.mark.e2e  # make test-e2e (also run by CI): minutes of servers, kept out of make test

MODEL = str(stories_model())
QUESTION = "Tell me a story about a cat."
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 1,
                                                          "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]


def start(tmp_path_factory, *flags: str) -> ServerProcess:
    tmp = tmp_path_factory.mktemp("responses")
    template = tmp / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    return ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, "--chat-template", str(template),
                                           *flags], tmp / "server.log")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = start(tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def chat(client, messages, **kwargs):
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                          **kwargs)


def test_a_response_is_the_chat_completion_of_its_conversation(client):
    resp = client.responses.create(model=MODEL, input=QUESTION, instructions="Be brief.",
                                   max_output_tokens=12, temperature=0)
    expected = chat(client, [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": QUESTION}], max_tokens=12)
    assert resp.object == "response" and resp.id.startswith("resp_")
    assert resp.status == "incomplete"  # 12 tokens cut it short
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in resp.output] == ["message"]
    assert resp.output_text == expected.choices[0].message.content
    assert resp.usage.input_tokens == expected.usage.prompt_tokens
    assert resp.usage.output_tokens == 12
    assert resp.usage.total_tokens == expected.usage.total_tokens
    assert resp.instructions == "Be brief." and resp.max_output_tokens == 12


def test_input_items_are_chat_messages(client):
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": QUESTION}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "Once upon a time"}]},
             {"role": "user", "content": "More."}]
    resp = client.responses.create(model=MODEL, input=items, max_output_tokens=8,
                                   temperature=0)
    expected = chat(client, [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": QUESTION},
                             {"role": "assistant", "content": "Once upon a time"},
                             {"role": "user", "content": "More."}], max_tokens=8)
    assert resp.output_text == expected.choices[0].message.content


def test_streamed_events_add_up_to_the_whole_response(client):
    whole = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=12,
                                    temperature=0)
    events = list(client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=12,
                                          temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:5] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added",
                         "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    assert events[-4].text == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text
    # the same counts (the prefix cache served the second more: cached_tokens differ)
    assert (final.usage.input_tokens, final.usage.output_tokens) == \
        (whole.usage.input_tokens, whole.usage.output_tokens)
    added, done = events[2], events[-2]
    assert added.item.id == done.item.id == final.output[0].id
    assert added.item.status == "in_progress" and done.item.status == "incomplete"
    # a streamed response is stored as it ended
    assert client.responses.retrieve(final.id).output_text == whole.output_text


def test_text_format_json_schema(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}},
              "required": ["name"], "additionalProperties": False}
    resp = client.responses.create(
        model=MODEL, input=QUESTION, max_output_tokens=64, temperature=0,
        text={"format": {"type": "json_schema", "name": "pet", "schema": schema}})
    assert resp.status == "completed"
    jsonschema.validate(json.loads(resp.output_text), schema)
    assert resp.text.format.type == "json_schema"


def test_function_tool_round_trip_with_previous_response_id(client):
    first = client.responses.create(model=MODEL, input="What is the weather in Paris?",
                                    tools=TOOLS, tool_choice="required", temperature=0,
                                    parallel_tool_calls=False, max_output_tokens=96)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and first.status == "completed"
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, WEATHER)

    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, temperature=0, max_output_tokens=8,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert second.previous_response_id == first.id
    # the same turn sent whole, as chat messages: the same answer from the same prompt
    expected = chat(client, [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call.call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}], max_tokens=8)
    assert second.output_text == expected.choices[0].message.content
    assert second.usage.input_tokens == expected.usage.prompt_tokens

    named = client.responses.create(model=MODEL, input="Weather?", tools=TOOLS,
                                    tool_choice={"type": "function", "name": "get_weather"},
                                    temperature=0, max_output_tokens=64)
    assert [item.type for item in named.output] == ["function_call"]
    jsonschema.validate(json.loads(named.output[0].arguments), WEATHER)


def test_streamed_function_call_events(client):
    events = list(client.responses.create(
        model=MODEL, input="Weather?", tools=TOOLS, temperature=0, max_output_tokens=64,
        tool_choice={"type": "function", "name": "get_weather"}, stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    deltas = "".join(e.delta for e in events
                     if e.type == "response.function_call_arguments.delta")
    assert done.arguments == deltas
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[0].arguments == deltas


def test_get_delete_and_store_false(server, client):
    resp = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=4)
    assert client.responses.retrieve(resp.id).model_dump() == resp.model_dump()
    deleted = httpx.delete(f"{server.url}/v1/responses/{resp.id}").json()
    assert deleted == {"id": resp.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)
    assert httpx.delete(f"{server.url}/v1/responses/{resp.id}").status_code == 404

    unstored = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=4,
                                       store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="Go on", previous_response_id=unstored.id)
    assert err.value.body["param"] == "previous_response_id"


@pytest.mark.parametrize("body, param", [
    ({}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"type": "image", "url": "x"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
     "text.format.schema"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x",
                                         "schema": {"type": "nonsense"}}}},
     "text.format.schema"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "temperature": -1}, "temperature"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": "hi", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice"),
    ({"input": "hi", "previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"input": "hi", "model": "another-model"}, "model"),
])
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    resp = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert resp.status_code == (404 if param == "model" else 400), resp.text
    assert resp.json()["error"]["param"] == param
    assert httpx.get(server.url + "/health").status_code == 200


def test_reasoning_items_with_a_reasoning_parser(tmp_path_factory):
    # deepseek_r1: all the output is thinking until </think>, which the stories model never
    # writes: a response of one reasoning item, the chat answer's reasoning_content.
    server = start(tmp_path_factory, "--reasoning-parser", "deepseek_r1")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        resp = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=10,
                                       temperature=0)
        expected = chat(client, [{"role": "user", "content": QUESTION}], max_tokens=10)
        assert [item.type for item in resp.output] == ["reasoning"]
        assert resp.output[0].content[0].text == expected.choices[0].message.reasoning_content
        assert 0 < resp.usage.output_tokens_details.reasoning_tokens <= 10
        events = list(client.responses.create(model=MODEL, input=QUESTION,
                                              max_output_tokens=10, temperature=0,
                                              stream=True))
        deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
        assert deltas == resp.output[0].content[0].text
        assert events[-1].response.output[0].type == "reasoning"
    finally:
        server.stop()


def test_the_store_evicts_the_least_recently_used():
    store = ResponseStore(2)
    kept = [StoredResponse(ResponseObject(model="m"), []) for _ in range(3)]
    store.put(kept[0])
    store.put(kept[1])
    assert store.get(kept[0].response.id) is kept[0]  # now the most recently used
    store.put(kept[2])
    assert store.get(kept[1].response.id) is None
    assert store.get(kept[0].response.id) is kept[0] and store.get(kept[2].response.id)
    assert store.delete(kept[0].response.id) and not store.delete(kept[0].response.id)


def test_a_server_without_a_store_refuses_previous_response_id():
    serving = OpenAIServingResponses(chat=None, store=ResponseStore(0))
    req = ResponsesRequest(input="hi", previous_response_id="resp_x")
    with pytest.raises(OpenAIError) as err:
        serving._history(req)
    assert err.value.param == "previous_response_id" and err.value.status == 400


def test_a_negative_store_size_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:  # argparse's refusal, status 2
        main(["serve", "--responses-store-size", "-1"])
    assert exit_.value.code == 2
    assert "must be >= 0, got -1" in capsys.readouterr().err
