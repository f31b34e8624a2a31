"""/v1/completions with use_beam_search (vLLM's extra field) on a stories260K server: the
choices are LLM.beam_search's hypotheses, best first, n per prompt; what cannot be
searched is a 400 naming its field."""

from __future__ import annotations

import httpx
import pytest

from minivllm import LLM
from minivllm.sampling_params import BeamSearchParams
from tests.server_utils import FAST_ENGINE_ARGS, ServerProcess, stories_model

pytestmark = pytest.mark.e2e  # make test-e2e (also run by CI): minutes of servers, kept out of make test

MAX_MODEL_LEN = 128


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, "--max-model-len",
                                             str(MAX_MODEL_LEN), "--served-model-name", "stories"],
                           tmp_path_factory.mktemp("beam") / "server.log")
    yield server
    server.stop()


def post(server, **fields) -> httpx.Response:
    body = {"model": "stories", "prompt": "Once upon a time", "max_tokens": 8,
            "use_beam_search": True, "n": 3, **fields}
    return httpx.post(server.url + "/v1/completions", json=body, timeout=60)


def test_choices_are_the_beam_searchs_hypotheses(server):
    prompts = ["Once upon a time", "The cat"]
    r = post(server, prompt=prompts, length_penalty=0.5, return_token_ids=True)
    assert r.status_code == 200, r.text
    answer = r.json()
    llm = LLM(str(stories_model()), dtype="float32", max_model_len=MAX_MODEL_LEN)
    expected = llm.beam_search(prompts, BeamSearchParams(3, 8, length_penalty=0.5))
    choices = sorted(answer["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == list(range(6))
    for i, output in enumerate(expected):
        for j, sequence in enumerate(output.sequences):
            choice = choices[i * 3 + j]
            generated = sequence.tokens[len(choice["prompt_token_ids"]):]
            assert choice["token_ids"] == generated
            assert choice["text"] == llm.get_tokenizer().decode(generated,
                                                                 skip_special_tokens=True)
            assert choice["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 6 * 8


@pytest.mark.parametrize("fields,param", [
    ({"n": 0}, "n"),
    ({"n": 11}, "n"),  # 2 * 11 logprobs a step: over --max-logprobs 20
    ({"temperature": 0.8}, "temperature"),
    ({"stream": True}, "stream"),
    ({"logprobs": 2}, "logprobs"),
    ({"best_of": 4}, "best_of"),
    ({"max_tokens": MAX_MODEL_LEN}, "max_tokens"),
    ({"early_stopping": "sometimes"}, "early_stopping"),
])
def test_bad_beam_search_names_the_field(server, fields, param):
    r = post(server, **fields)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
