"""A tiny random model whose tokenizer has Qwen2.5-Coder's fill-in-the-middle tokens, for
the llama-server API tests (tests/entrypoints/test_llamacpp_*.py)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tests.model_factory import VOCAB_SIZE, save_tiny_model

# Qwen2.5-Coder's names, the last ids of the vocabulary (instead of words w505 ... w511)
FIM_SPECIALS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>",
                "<|file_sep|>", "<|fim_pad|>", "<|endoftext|>"]
FIRST_SPECIAL = VOCAB_SIZE - len(FIM_SPECIALS)
FIM_IDS = dict(zip(("pre", "suf", "mid", "rep", "sep", "pad", "end"),
                   range(FIRST_SPECIAL, VOCAB_SIZE)))


def save_fim_model(directory: Path) -> Path:
    """The tiny llama of model_factory, with words w3 ... w504 and the FIM tokens."""
    save_tiny_model("llama", directory)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, FIRST_SPECIAL)}}
    vocab.update({name: FIRST_SPECIAL + i for i, name in enumerate(FIM_SPECIALS)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>", additional_special_tokens=FIM_SPECIALS
                            ).save_pretrained(directory)
    return directory
