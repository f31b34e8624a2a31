"""The JSON number guard (structured_output/number_guard.py): in a JSON output, a number is
ended once it has 20 digits where the grammar allows ending it; digits inside strings never
count; other constraints (regex, grammar) are untouched. Driven through the real Sampler and
llguidance on the demo model's tokenizer, with logits that always prefer the digit "1": the
model that never ends a number, as SmolLM2 at temperature 0 is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

import minivllm
from minivllm.model.sampler import Sampler
from minivllm.sampling_params import SamplingParams, StructuredOutputsParams
from minivllm.structured_output.manager import StructuredOutputManager
from minivllm.structured_output.number_guard import (
    MAX_NUMBER_DIGITS,
    JsonNumberGuard,
    NumberGuardTables,
)

DEMO = Path(minivllm.__file__).parent / "demo_model"
NUMBER = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"],
          "additionalProperties": False}
STRING = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEMO)


@pytest.fixture(scope="module")
def manager(tokenizer):
    manager = StructuredOutputManager(tokenizer, len(tokenizer), {tokenizer.eos_token_id})
    yield manager
    manager.shutdown()


def generate(tokenizer, manager, max_tokens: int = 80, **constraint) -> tuple[str, bool]:
    """Decodes with logits that rank "1" first, then "}", then '"', then the rest: (the text,
    whether EOS ended it)."""
    vocab = len(tokenizer)
    one, close, quote = (tokenizer.convert_tokens_to_ids(t) for t in ("1", "}", '"'))
    logits = torch.zeros(1, vocab)
    logits[0, one], logits[0, close], logits[0, quote] = 30.0, 20.0, 10.0
    sampler = Sampler(vocab, torch.device("cpu"), seed=0, use_kernel=False, structured=manager)
    params = SamplingParams(temperature=0, max_tokens=max_tokens,
                            structured_outputs=StructuredOutputsParams(**constraint))
    sampler.add_request("r", params, [1], [], [], seed=0)
    tokens = []
    for _ in range(max_tokens):
        (token,) = sampler.sample(logits, ["r"]).token_ids
        if token == tokenizer.eos_token_id:
            return tokenizer.decode(tokens), True
        tokens.append(token)
    return tokenizer.decode(tokens), False


def test_a_json_number_ends_at_20_digits(tokenizer, manager):
    text, ended = generate(tokenizer, manager, json=NUMBER)
    assert ended, text
    assert text.replace(" ", "") == '{"x":' + "1" * MAX_NUMBER_DIGITS + "}"


def test_digits_inside_a_string_are_not_a_number(tokenizer, manager):
    """A string of digits (a phone or card number) is the model's to end: still all "1"s at
    max_tokens, far past 20."""
    text, ended = generate(tokenizer, manager, json=STRING)
    assert not ended and text.replace(" ", "").startswith('{"s":"' + "1" * 40), text


def test_a_regex_is_not_guarded(tokenizer, manager):
    text, ended = generate(tokenizer, manager, max_tokens=40, regex=r"[0-9]+")
    assert text == "1" * 40 and not ended


def lexer(tables_bytes: list[bytes], text_tokens: list[int]) -> JsonNumberGuard:
    guard = JsonNumberGuard(NumberGuardTables(tables_bytes))
    for token in text_tokens:
        guard.consume(token)
    return guard


def test_the_lexer_counts_a_numbers_digits_and_skips_strings():
    vocab = [b'{"a": ', b"12", b".5e", b"+3", b", ", b'"x\\"1', b'2"', b"}", b"7"]
    assert lexer(vocab, [0, 1, 2, 3]).digits == 4  # 12.5e+3: mantissa and exponent
    assert lexer(vocab, [0, 1, 4]).digits == 0  # a separator ends the number
    in_string = lexer(vocab, [5, 1])  # an escaped quote does not close the string
    assert in_string.in_string and in_string.digits == 0
    assert not lexer(vocab, [5, 6]).in_string
    assert lexer(vocab, [5, 6, 8]).digits == 1


def test_restrict_masks_only_what_extends_a_full_number():
    vocab = [b"1", b".", b"e", b"}", b",", b"-"]
    guard = lexer(vocab, [0] * MAX_NUMBER_DIGITS)
    allowed = np.ones(len(vocab), dtype=bool)
    guard.restrict(allowed)
    assert allowed.tolist() == [False, False, False, True, True, False]
    only_digits = np.array([True, False, False, False, False, False])
    guard.restrict(only_digits)  # a grammar that needs another digit gets it
    assert only_digits.tolist() == [True, False, False, False, False, False]
    short = lexer(vocab, [0] * (MAX_NUMBER_DIGITS - 1))
    allowed = np.ones(len(vocab), dtype=bool)
    short.restrict(allowed)
    assert allowed.all()
