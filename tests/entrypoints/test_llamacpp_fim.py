"""Fill-in-the-middle's parts without a server: the FIM token ids read from a GGUF file's
metadata (new keys, the older ones, skipping the vocabulary before them) or found in the
vocabulary by name; llama-server's infill layout (repo-level with file tokens, snippets
without, its cuts, BOS); the end-of-generation tokens; a token's bytes; n_indent's stop."""

from __future__ import annotations

import gguf
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from minivllm.entrypoints.llamacpp.fim import (
    FimTokens,
    eog_token_ids,
    find_fim_tokens,
    infill_prompt,
)
from minivllm.entrypoints.llamacpp.gguf_metadata import read_scalars
from minivllm.entrypoints.llamacpp.pieces import piece
from minivllm.entrypoints.llamacpp.progress import Progress
from minivllm.outputs import CompletionOutput

SPECIALS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>",
            "<|file_sep|>", "<|fim_pad|>", "<|endoftext|>"]


def word_tokenizer(specials: list[str], bos: bool = False) -> PreTrainedTokenizerFast:
    """Words w3 ... w99 (ids 3 ... 99), then the special tokens, ids 100 on."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 100)}}
    vocab.update({name: 100 + i for i, name in enumerate(specials)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos:
        from tokenizers.processors import TemplateProcessing
        tok.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", additional_special_tokens=specials)


def write_gguf(path, **ids) -> None:
    """A GGUF file of metadata only: a vocabulary (strings), scores (floats), then the ids."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list([f"t{i}" for i in range(5000)])
    writer.add_token_scores([0.5] * 5000)
    writer.add_string("general.name", "fim test")
    for key, value in ids.items():
        writer.add_uint32(f"tokenizer.ggml.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


def test_gguf_metadata_new_keys_win_over_the_vocabulary(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, fim_pre_token_id=7, fim_suf_token_id=8, fim_mid_token_id=9,
               fim_sep_token_id=11)
    assert read_scalars(path, {"general.name", "tokenizer.ggml.fim_mid_token_id"}) == {
        "general.name": "fim test", "tokenizer.ggml.fim_mid_token_id": 9}
    fim = find_fim_tokens(word_tokenizer(SPECIALS), path)
    # the file's ids for pre / suf / mid / sep; the vocabulary's for the rest
    assert fim == FimTokens(pre=7, suf=8, mid=9, pad=105, rep=103, sep=11)


def test_gguf_metadata_older_keys(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, prefix_token_id=4, suffix_token_id=5, middle_token_id=6)
    fim = find_fim_tokens(word_tokenizer([]), path)
    assert (fim.pre, fim.suf, fim.mid) == (4, 5, 6) and fim.missing() == []


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"NOPE" + bytes(20))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_scalars(path, {"x"})


def test_tokens_by_name_and_the_missing_ones_named():
    assert find_fim_tokens(word_tokenizer(SPECIALS), None) == FimTokens(
        pre=100, suf=101, mid=102, pad=105, rep=103, sep=104)
    starcoder = find_fim_tokens(word_tokenizer(["<fim_prefix>", "<fim_suffix>",
                                                "<fim_middle>"]), None)
    assert (starcoder.pre, starcoder.suf, starcoder.mid) == (100, 101, 102)
    none = find_fim_tokens(word_tokenizer(["<|fim_prefix|>"]), None)
    with pytest.raises(ValueError) as err:
        none.check("input_prefix")
    message = str(err.value)
    assert "input_prefix" in message and "suffix" in message and "middle" in message
    assert "FIM prefix" not in message  # the one it has is not named missing


def test_repo_level_layout_and_eog():
    tok = word_tokenizer(SPECIALS)
    fim = find_fim_tokens(tok, None)
    ids = infill_prompt(tok, fim, "w10 w11", "w12", [("a.py", "w20 w21")], "w13",
                        n_ctx=10_000, n_predict=16)
    # [REP]myproject [SEP]a.py w20 w21 [SEP]filename [PRE]w10 w11 w13 [SUF]w12 [MID]
    # (the word tokenizer knows neither myproject nor the file names: <unk>, 0)
    assert ids == [103, 0, 104, 0, 20, 21, 104, 0, 100, 10, 11, 13, 101, 12, 102]
    assert eog_token_ids(tok, fim) == [103, 104, 105, 106]  # repo, file sep, pad, endoftext


def test_snippet_layout_and_bos_without_file_tokens():
    tok = word_tokenizer(SPECIALS[:3], bos=True)
    fim = find_fim_tokens(tok, None)
    ids = infill_prompt(tok, fim, "w10", "w12", [("a.py", "w20")], "", n_ctx=10_000,
                        n_predict=16)
    snippet = tok.encode("\n\n--- snippet ---\n\n", add_special_tokens=False)
    assert ids == [*snippet, 20, 1, 100, 10, 101, 12, 102]  # BOS after the extra context


def test_cuts_prefix_suffix_and_extra():
    tok = word_tokenizer(SPECIALS)
    fim = find_fim_tokens(tok, None)
    prefix = " ".join(f"w{3 + i % 90}" for i in range(100))
    # n_ctx 64: a batch of 32, the prefix's last 24 tokens, the suffix's first 8 - 2, no
    # room for the extra context (64 - 32 - 2 * 16), not even the repo-level header
    ids = infill_prompt(tok, fim, prefix, prefix, [("a.py", "w20")], "", n_ctx=64,
                        n_predict=16)
    words = tok.encode(prefix, add_special_tokens=False)
    assert ids == [100, *words[-24:], 101, *words[:6], 102]
    # from 4096 on, llama-server's 2048-token batch: 4096 - 2048 - 2 * 1023 leaves the last
    # 2 tokens of the extra context ([SEP]filename)
    ids = infill_prompt(tok, fim, "w10", "w12", [("a.py", "w20")], "", n_ctx=4096,
                        n_predict=1023)
    assert ids == [104, 0, 100, 10, 101, 12, 102]


def test_pieces_are_text_or_bytes():
    tok = word_tokenizer(SPECIALS)
    assert piece(tok, 10) == "w10" and piece(tok, 100) == "<|fim_prefix|>"


def indent_cut(chunks: list[str], n_indent: int) -> tuple[str, bool]:
    progress = Progress(n_indent)
    for chunk in chunks:
        progress.add(CompletionOutput(0, chunk, [7], None, None))
    return progress.text, progress.cut


def test_n_indent_cuts_the_first_line_indented_less():
    # the first line is free; the blank line after the body is indented 0 < 4: cut there
    assert indent_cut(["    return x * x\n", "\n", "\nassert"], 4) == ("    return x * x\n", True)
    # a line's indentation split across deltas, then too short: cut after its blanks
    assert indent_cut(["a\n  ", "      b\n    ", "c"], 8) == ("a\n        b\n    ", True)
    assert indent_cut(["a\n", "   "], 4) == ("a\n   ", False)  # not known yet
    assert indent_cut(["a\nb\n"], 0) == ("a\nb\n", False)  # 0: off
