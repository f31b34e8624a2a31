"""llama-server's native API on a real `minivllm serve` of a tiny model with FIM tokens:
/completion (its prompt shapes, fields, stream, n_probs, stops, the context's end) answers
what /v1/completions answers; /infill is the raw FIM prompt through /completion, and so is
/v1/completions' suffix; /tokenize in both forms; /props, /slots, /health."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.entrypoints.llamacpp_models import FIM_IDS, save_fim_model
from tests.server_utils import FAST_ENGINE_ARGS, SLOW_STEPS, ServerProcess

MAX_MODEL_LEN = 64
MAX_NUM_SEQS = 8  # FAST_ENGINE_ARGS'
PROMPT = "w10 w11 w12 w13"
FINAL_KEYS = {"index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted",
              "tokens_evaluated", "generation_settings", "prompt", "has_new_line", "truncated",
              "stop_type", "stopping_word", "tokens_cached", "timings"}
TIMINGS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
           "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llamacpp")
    model = save_fim_model(tmp / "model")
    # 5 ms steps: a request stays in flight long enough for /slots to see it
    server = ServerProcess(model, [*FAST_ENGINE_ARGS, "--max-model-len", str(MAX_MODEL_LEN),
                                   "--served-model-name", "tiny-fim"],
                           tmp / "server.log", prelude=SLOW_STEPS)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def post(http, path: str, **body) -> dict:
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def greedy(**fields) -> dict:
    """Greedy, 8 tokens whatever they are (the random model writes EOS at times)."""
    return {"temperature": 0, "n_predict": 8, "return_tokens": True, "ignore_eos": True,
            **fields}


def test_health(http):
    r = http.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_completion_is_the_openai_completion(http):
    answer = post(http, "/completion", prompt=PROMPT, **greedy())
    assert set(answer) == FINAL_KEYS and set(answer["timings"]) == TIMINGS
    openai = post(http, "/v1/completions", prompt=PROMPT, max_tokens=8, temperature=0,
                  return_token_ids=True, ignore_eos=True)["choices"][0]
    assert answer["tokens"] == openai["token_ids"] and answer["content"] == openai["text"]
    assert answer["tokens_predicted"] == 8 and answer["tokens_evaluated"] == 4
    assert (answer["stop"], answer["stop_type"], answer["truncated"]) == (True, "limit", False)
    assert answer["model"] == "tiny-fim" and answer["generation_settings"]["n_predict"] == 8
    assert answer["generation_settings"]["temperature"] == 0
    assert answer["timings"]["predicted_n"] == 8 and answer["timings"]["prompt_n"] \
        + answer["timings"]["cache_n"] == 4


def test_prompt_shapes(http):
    text = post(http, "/completion", prompt=PROMPT, **greedy())
    ids = post(http, "/completion", prompt=[10, 11, 12, 13], **greedy())
    mixed = post(http, "/completion", prompt=[10, "w11 w12", 13], **greedy())
    assert text["tokens"] == ids["tokens"] == mixed["tokens"]
    several = post(http, "/completion", prompt=["w10 w11", PROMPT], **greedy())
    assert [a["index"] for a in several] == [0, 1] and several[1]["tokens"] == text["tokens"]


def test_stream_is_the_whole_answer_in_parts(http):
    whole = post(http, "/completion", prompt=PROMPT, **greedy())
    with http.stream("POST", "/completion", json={"prompt": PROMPT, **greedy(),
                                                  "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith(
            "text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines()
                  if line.startswith("data: ")]
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert "".join(e["content"] for e in events) == whole["content"]
    assert [t for e in events for t in e["tokens"]] == whole["tokens"]
    assert set(events[-1]) == FINAL_KEYS and events[-1]["tokens_predicted"] == 8


def test_n_probs(http):
    answer = post(http, "/completion", prompt=PROMPT, n_probs=3, **greedy())
    probs = answer["completion_probabilities"]
    assert [p["id"] for p in probs] == answer["tokens"]
    for p in probs:
        assert set(p) == {"id", "token", "bytes", "logprob", "top_logprobs"}
        assert len(p["top_logprobs"]) == 3 and p["top_logprobs"][0]["id"] == p["id"]
        assert bytes(p["bytes"]).decode() == p["token"] and p["logprob"] <= 0


def test_n_predict_zero_and_past_the_context(http):
    nothing = post(http, "/completion", prompt=PROMPT, **greedy(n_predict=0))
    assert (nothing["content"], nothing["tokens_predicted"]) == ("", 0)
    everything = post(http, "/completion", prompt=PROMPT, **greedy(n_predict=10_000))
    assert everything["tokens_predicted"] == MAX_MODEL_LEN - 4
    assert everything["stop_type"] == "limit" and everything["truncated"] is True


def test_response_fields(http):
    fields = ["content", "timings/prompt_n", "generation_settings/n_predict", "nope/x"]
    answer = post(http, "/completion", prompt=PROMPT, response_fields=fields, **greedy())
    assert set(answer) == {"content", "timings/prompt_n", "generation_settings/n_predict"}
    assert answer["generation_settings/n_predict"] == 8


def test_stop_word(http):
    whole = post(http, "/completion", prompt=PROMPT, **greedy())
    word = whole["content"].split()[3]
    stopped = post(http, "/completion", prompt=PROMPT, stop=[word], **greedy())
    assert stopped["stop_type"] == "word" and stopped["stopping_word"] == word
    assert whole["content"].startswith(stopped["content"]) and word not in stopped["content"]


def raw_fim(prefix: list[int], suffix: list[int], files: list[list[int]] = ()) -> list[int]:
    """The repo-level FIM prompt by hand ("myproject", file names: the tokenizer's <unk>)."""
    ids = [FIM_IDS["rep"], 0]
    for text in files:
        ids += [FIM_IDS["sep"], 0, *text]
    return [*ids, FIM_IDS["sep"], 0, FIM_IDS["pre"], *prefix, FIM_IDS["suf"], *suffix,
            FIM_IDS["mid"]]


def test_infill_is_the_raw_fim_prompt(http):
    infill = post(http, "/infill", input_prefix="w20 w21", input_suffix="w22",
                  input_extra=[{"filename": "a.py", "text": "w30"}], **greedy())
    raw = post(http, "/completion", prompt=raw_fim([20, 21], [22], [[30]]), **greedy())
    assert set(infill) == FINAL_KEYS
    assert infill["tokens"] == raw["tokens"] and infill["tokens_evaluated"] == len(
        raw_fim([20, 21], [22], [[30]]))
    # `prompt` continues the prefix
    typed = post(http, "/infill", input_prefix="w20", input_suffix="w22", prompt="w21",
                 **greedy())
    assert typed["tokens"] == post(http, "/completion", prompt=raw_fim([20, 21], [22]),
                                   **greedy())["tokens"]


def test_openai_suffix_is_the_infill(http):
    infill = post(http, "/infill", input_prefix="w20 w21", input_suffix="w22", **greedy())
    choice = post(http, "/v1/completions", prompt="w20 w21", suffix="w22", max_tokens=8,
                  temperature=0, return_token_ids=True, ignore_eos=True)["choices"][0]
    assert choice["token_ids"] == infill["tokens"] and choice["text"] == infill["content"]
    assert choice["prompt_token_ids"] == raw_fim([20, 21], [22])


def test_infill_bad_input(http):
    for body, field in (({"input_suffix": "w1"}, "input_prefix"),
                        ({"input_prefix": "w1", "input_suffix": 3}, "input_suffix"),
                        ({"input_prefix": "", "input_suffix": "", "input_extra": "x"},
                         "input_extra"),
                        ({"input_prefix": "", "input_suffix": "", "input_extra": [{}]},
                         "input_extra"),
                        ({"input_prefix": "", "input_suffix": "", "prompt": [1]}, "prompt")):
        r = http.post("/infill", json=body)
        assert r.status_code == 400 and field in r.json()["error"]["message"], r.text
        assert r.json()["error"]["type"] == "invalid_request_error"
    # a long prefix and suffix are cut to fit, as llama-server cuts them
    long = " ".join(["w40"] * 500)
    cut = post(http, "/infill", input_prefix=long, input_suffix=long, **greedy(n_predict=4))
    assert cut["tokens_evaluated"] < MAX_MODEL_LEN and cut["tokens_predicted"] == 4


def test_tokenize_both_forms(http):
    assert post(http, "/tokenize", content=PROMPT) == {"tokens": [10, 11, 12, 13]}
    pieces = post(http, "/tokenize", content="w10 <|fim_prefix|>", with_pieces=True)
    assert pieces == {"tokens": [{"id": 10, "piece": "w10"},
                                 {"id": FIM_IDS["pre"], "piece": "<|fim_prefix|>"}]}
    # one word for the word tokenizer: the special token split off it, or an unknown word
    glued = "w10<|fim_prefix|>"
    assert post(http, "/tokenize", content=glued)["tokens"] == [10, FIM_IDS["pre"]]
    assert post(http, "/tokenize", content=glued, parse_special=False)["tokens"] == [0]
    vllm = post(http, "/tokenize", prompt=PROMPT)
    assert vllm["count"] == 4 and vllm["max_model_len"] == MAX_MODEL_LEN
    assert post(http, "/detokenize", tokens=[10, 11]) == {"prompt": "w10 w11",
                                                          "content": "w10 w11"}
    r = http.post("/tokenize", json={"content": "w10", "prompt": "w10"})
    assert r.status_code == 400


def test_props(http, server):
    props = http.get("/props").json()
    assert props["total_slots"] == MAX_NUM_SEQS and props["model_alias"] == "tiny-fim"
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == MAX_MODEL_LEN
    assert (settings["params"]["temperature"], settings["params"]["top_k"]) == (0.8, 40)
    assert props["eos_token"] == "</s>" and props["model_path"].endswith("model")


def test_slots_show_a_request_in_flight(http):
    idle = http.get("/slots").json()
    assert [s["id"] for s in idle] == list(range(MAX_NUM_SEQS))
    assert not any(s["is_processing"] for s in idle)
    body = {"prompt": PROMPT, "n_predict": 40, "ignore_eos": True, "stream": True,
            "temperature": 0.5}
    with http.stream("POST", "/completion", json=body) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        busy = http.get("/slots").json()
        for _ in lines:
            pass
    seat = busy[0]
    assert seat["is_processing"] and not any(s["is_processing"] for s in busy[1:])
    assert isinstance(seat["id_task"], int) and seat["n_prompt_tokens"] == 4
    assert seat["params"]["temperature"] == 0.5 and seat["params"]["n_predict"] == 40
    assert seat["next_token"][0]["n_decoded"] >= 1
    assert http.get("/slots", params={"fail_on_no_slot": 1}).status_code == 200


def test_a_client_leaving_mid_stream_aborts_its_request(http, server):
    abort_key = 'vllm:request_success_total{finished_reason="abort"}'
    before = server.metrics().get(abort_key, 0)
    body = {"prompt": PROMPT, "n_predict": 50, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as leaving:
        with leaving.stream("POST", "/completion", json=body) as r:
            next(line for line in r.iter_lines() if line.startswith("data: "))
    deadline = time.monotonic() + 10
    while server.metrics().get(abort_key, 0) == before:
        assert time.monotonic() < deadline, "the request was not aborted"
        time.sleep(0.05)
    assert not any(s["is_processing"] for s in http.get("/slots").json())


def test_openai_suffix_bad_input(http):
    for body, param in (({"prompt": [20, 21], "suffix": "w22"}, "suffix"),
                        ({"prompt": "w20", "suffix": "w22", "echo": True}, "echo"),
                        ({"prompt": "w20", "suffix": 3}, "suffix")):
        r = http.post("/v1/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
