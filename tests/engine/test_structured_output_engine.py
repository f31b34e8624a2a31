"""Constrained decoding in the engine, offline on the demo model: JSON schema, regex, choice
and grammar outputs always match, greedy and sampled; an unconstrained request is
token-identical with and without constrained neighbours; a constrained request preempted
(recompute) resumes its grammar where it was; SamplingParams with a constraint crosses to the
engine-core process (msgpack) intact; `\\d` and `\\w` are ASCII (ECMA-262) in a regex and a
JSON Schema pattern."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import jsonschema
import llguidance
import msgspec
import numpy as np
import pytest
import torch

import minivllm
from minivllm import LLM, SamplingParams
from minivllm.engine.messages import EngineCoreRequest
from minivllm.sampling_params import StructuredOutputsParams
from minivllm.structured_output.grammar import build_grammar
from minivllm.structured_output.manager import fill_bitmask
from tests.conftest import assert_all_blocks_free
from tests.engine.test_preemption_e2e import record_preemptions

DEMO = Path(minivllm.__file__).parent / "demo_model"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
        "home": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                 "required": ["city"], "additionalProperties": False},
    },
    "required": ["name", "age", "pets", "home"],
    "additionalProperties": False,
}
PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went to the park", "One day"]


@pytest.fixture(scope="module")
def llm():
    return LLM(model=str(DEMO), num_kv_blocks=64, block_size=8)


def constrained(seed: int | None, temperature: float, **constraint) -> SamplingParams:
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=80,
                          structured_outputs=StructuredOutputsParams(**constraint))


def test_outputs_match_their_constraint_greedy_and_sampled(llm):
    params = [constrained(i, 0.0 if i % 2 else 1.0, json=SCHEMA) for i in range(8)]
    params += [constrained(i, 1.0, regex=r"[A-Z][a-z]{2,5}-[0-9]{3}") for i in range(4)]
    params += [constrained(i, 1.0, choice=["left", "right", "up and away"]) for i in range(4)]
    params += [constrained(i, 1.2, grammar='root ::= "(" ("a" | "b")+ ")"') for i in range(3)]
    prompts = [PROMPTS[i % 4] for i in range(len(params))]
    outputs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert all(o.finish_reason == "stop" for o in outputs), [o.text for o in outputs]
    for o in outputs[:8]:
        jsonschema.validate(json.loads(o.text), SCHEMA)
    assert all(re.fullmatch(r"[A-Z][a-z]{2,5}-[0-9]{3}", o.text) for o in outputs[8:12])
    assert all(o.text in ("left", "right", "up and away") for o in outputs[12:16])
    assert all(re.fullmatch(r"\([ab]+\)", o.text) for o in outputs[16:])


def test_unconstrained_rows_untouched_by_constrained_neighbours(llm):
    plain = [SamplingParams(temperature=t, seed=7, max_tokens=24, ignore_eos=True)
             for t in (0.0, 0.9)]
    alone = llm.generate(PROMPTS[:2], plain, use_tqdm=False)
    mixed = llm.generate(PROMPTS[:2] + PROMPTS[2:], plain + [
        constrained(1, 1.0, json=SCHEMA), constrained(2, 0.0, regex="[0-9]{20}")],
        use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[:2]] == [
        o.outputs[0].token_ids for o in alone]


def test_recompute_preemption_resumes_the_grammar(llm):
    params = [constrained(i, 1.0, json=SCHEMA) for i in range(4)]
    reference = [o.outputs[0].text for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    tight = LLM(model=str(DEMO), num_kv_blocks=24, block_size=4, preemption_mode="recompute")
    preemptions = record_preemptions(tight)
    texts = [o.outputs[0].text for o in tight.generate(PROMPTS, params, use_tqdm=False)]
    assert sum(preemptions.values()) > 0
    assert texts == reference  # seeded: the same tokens, resumed mid-grammar
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)


def test_constraint_crosses_to_the_engine_core_process():
    params = SamplingParams(structured_outputs=StructuredOutputsParams(json=SCHEMA))
    request = EngineCoreRequest("r", [1, 2], params, 0.0)
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(request), type=EngineCoreRequest)
    assert decoded.sampling_params.structured_outputs == params.structured_outputs
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])


class ByteTokenizer:
    """One token per byte, and EOS: any UTF-8 text can be fed to a matcher, byte by byte."""
    eos_token_id, bos_token_id, special_token_ids = 256, None, [256]
    tokens = [bytes([b]) for b in range(256)] + [b"</s>"]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


def grammar_accepts(params: StructuredOutputsParams, text: str) -> bool:
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteTokenizer()))
    matcher = llguidance.LLMatcher(tokenizer, build_grammar(params), log_level=0)
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


@pytest.mark.parametrize("kind", ["regex", "pattern"])
@pytest.mark.parametrize("regex, text, accepted", [
    (r"\d+-\w+", "012-na_mj", True),
    (r"\d+-\w+", "0\U00010d48\u0662-namj", False),  # Unicode digits are not \d
    (r"[\d]+", "\u0662", False),
    (r"\w+", "\u00e9", False),
    (r"\D", "\u0662", True),
    (r"\D", "7", False),
    (r"\s", "\u00a0", True),  # \s stays Unicode whitespace, as in ECMA-262
    (r"a/\d", "a/1", True),
])
def test_backslash_d_and_w_are_ascii_as_in_ecma_262(kind, regex, text, accepted):
    if kind == "regex":
        params = StructuredOutputsParams(regex=regex)
    else:
        params = StructuredOutputsParams(json={"type": "string", "pattern": f"^{regex}$"})
        text = f'"{text}"'
    assert grammar_accepts(params, text) == accepted


def test_a_request_added_again_resumes_its_grammar(llm):
    """The sampler's contract for a re-added request: a fresh matcher advanced over the
    output so far allows exactly what the running one allows."""
    sampler = llm.llm_engine.runner.sampler
    params = constrained(3, 1.0, json=SCHEMA)
    llm.llm_engine.core.structured.submit(params.structured_outputs).result()
    sampler.add_request("a", params, [1, 5], [], (), seed=3)
    logits = torch.randn(1, sampler.vocab_size)
    output = [sampler.sample(logits.clone(), ["a"]).token_ids[0] for _ in range(6)]
    sampler.add_request("b", params, [1, 5], output, (), seed=3)
    running, resumed = sampler._requests["a"].matcher, sampler._requests["b"].matcher
    fresh = llm.llm_engine.core.structured.new_matcher(params.structured_outputs)
    assert running.compute_bitmask() == resumed.compute_bitmask() != fresh.compute_bitmask()
    sampler.remove_request("a")
    sampler.remove_request("b")


def test_every_sequence_of_a_parallel_request_is_constrained(llm):
    params = SamplingParams(n=3, best_of=4, temperature=1.0, seed=1, max_tokens=30,
                            structured_outputs=StructuredOutputsParams(regex="[a-z]{2,8}!"))
    texts = [c.text for c in llm.generate(["Once"], params, use_tqdm=False)[0].outputs]
    assert len(texts) == 3 and all(re.fullmatch("[a-z]{2,8}!", t) for t in texts)


def test_a_structural_tag_constrains_only_what_follows_its_trigger(llm):
    tag = json.dumps({"type": "structural_tag", "triggers": ["<f="], "structures": [
        {"begin": "<f=get>", "schema": {"type": "object", "properties": {
            "n": {"type": "integer", "maximum": 9}}, "required": ["n"],
            "additionalProperties": False}, "end": "</f>"}]})
    params = StructuredOutputsParams(structural_tag=tag)
    manager, tokenizer = llm.llm_engine.core.structured, llm.get_tokenizer()
    matcher = manager.new_matcher(params)
    free = fill_bitmask([matcher], manager.vocab_size)[0]
    assert free.sum() > 500  # before the trigger: free text
    assert matcher.consume_tokens(tokenizer.encode("hi <f=get>", add_special_tokens=False))
    allowed = np.flatnonzero(fill_bitmask([matcher], manager.vocab_size)[0])
    texts = [tokenizer.decode([t]) for t in allowed]
    assert texts and all('{"n": '.startswith(t) for t in texts), texts


def test_a_compiling_grammar_stalls_no_other_request(llm):
    """While a grammar compiles (held here), an unconstrained request runs to the end; the
    constrained one then starts. An abort while compiling leaves nothing behind."""
    engine, manager = llm.llm_engine, llm.llm_engine.core.structured
    release = threading.Event()
    compile_original = manager._compile

    def held_compile(params):
        release.wait(30)
        return compile_original(params)

    manager._compile = held_compile
    try:
        slow = StructuredOutputsParams(regex="[0-9]{5}")
        engine.add_request("constrained", None, SamplingParams(
            max_tokens=8, structured_outputs=slow), prompt_token_ids=[1, 40, 50])
        engine.add_request("aborted", None, SamplingParams(
            max_tokens=8, structured_outputs=StructuredOutputsParams(regex="[a-z]{5}")),
            prompt_token_ids=[1, 40, 50])
        engine.abort_request("aborted")
        engine.add_request("plain", None, SamplingParams(max_tokens=8, ignore_eos=True),
                           prompt_token_ids=[1, 40, 50])
        finished = {}
        while "plain" not in finished:
            finished.update({o.request_id: o for o in engine.step() if o.finished})
        assert "constrained" not in finished
        release.set()
        while engine.has_unfinished_requests():
            finished.update({o.request_id: o for o in engine.step() if o.finished})
        assert re.fullmatch("[0-9]{5}", finished["constrained"].outputs[0].text)
        assert_all_blocks_free(llm)
    finally:
        release.set()
        manager._compile = compile_original
