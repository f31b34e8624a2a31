"""Prompts for the workload lab: ids from any tokenizer, even one that knows no English."""

from __future__ import annotations

import asyncio

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from minivllm.bench.prompts import LocalTokenizer, token_pool


def word_level_tokenizer(path, size: int) -> LocalTokenizer:
    """The tokenizer of minivllm/bench/models.py: w3, w4, ... and three specials."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    return LocalTokenizer(str(path))


def test_pool_of_a_word_level_tokenizer_comes_from_round_trips(tmp_path):
    pool = asyncio.run(token_pool(word_level_tokenizer(tmp_path, 100)))
    assert pool.tolist() == list(range(100))  # every id decodes and encodes back to itself


def test_pool_too_small_names_what_was_tried(tmp_path):
    with pytest.raises(RuntimeError, match="first 512 ids"):
        asyncio.run(token_pool(word_level_tokenizer(tmp_path, 5)))
