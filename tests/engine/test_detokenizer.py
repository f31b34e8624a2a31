"""Incremental detokenization: multi-byte characters split over tokens, leading spaces."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from minivllm.engine.detokenizer import IncrementalDetokenizer

TEXT = "Un café crème, s'il vous plaît! 你好，世界 🙂 naïve résumé"


def _stream(tokenizer, ids, prompt_ids=()):
    detok = IncrementalDetokenizer(tokenizer, list(prompt_ids), True, [], False)
    deltas = [detok.add_token(t) for t in ids]
    return deltas, detok.text


@pytest.fixture(scope="module")
def byte_level_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, the cat sat"] * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_byte_level_multibyte_characters(byte_level_tokenizer):
    ids = byte_level_tokenizer(TEXT).input_ids
    assert len(ids) > len(TEXT)  # characters really are split across tokens
    deltas, text = _stream(byte_level_tokenizer, ids)
    assert text == TEXT
    assert all("\ufffd" not in d for d in deltas)


def test_sentencepiece_spaces_and_byte_fallback(stories_dir):
    tokenizer = AutoTokenizer.from_pretrained(stories_dir)
    prompt = tokenizer("Once upon a time").input_ids
    ids = tokenizer(" there was a café 你好 and a dog", add_special_tokens=False).input_ids
    _, text = _stream(tokenizer, ids, prompt)
    assert text == tokenizer.decode(prompt + ids, skip_special_tokens=True)[len("Once upon a time"):]


def test_stop_string_found_across_deltas(byte_level_tokenizer):
    ids = byte_level_tokenizer("the cat sat on the mat").input_ids
    detok = IncrementalDetokenizer(byte_level_tokenizer, [], True, ["at on"], False)
    found = None
    for token in ids:
        delta = detok.add_token(token)
        found = found or detok.find_stop(len(delta))
        if found:
            break
    assert found == "at on" and detok.text == "the cat s"
