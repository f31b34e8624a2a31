"""The packaged demo model (minivllm/demo_model) is complete, small, and works with plain
transformers. No minivllm engine code is involved."""

from __future__ import annotations

from importlib.resources import as_file, files
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json", "MODEL_CARD.md")


@pytest.fixture(scope="module")
def model_dir():
    with as_file(files("minivllm") / "demo_model") as path:
        yield Path(path)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


def test_files_exist_and_are_small(model_dir):
    for name in FILES:
        assert (model_dir / name).is_file(), name
    total = sum(p.stat().st_size for p in model_dir.iterdir() if p.is_file())
    assert total < 15 * 2**20


def test_tokenizer_has_specials_and_chat_template(tokenizer):
    assert tokenizer.chat_template
    assert tokenizer.bos_token == "<s>" and tokenizer.eos_token == "</s>"
    assert tokenizer("Once upon a time").input_ids[0] == tokenizer.bos_token_id
    msgs = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi!"}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<s><|system|>\nBe kind.</s>")
    assert text.endswith("<|user|>\nHi!</s>\n<|assistant|>\n")
    no_prompt = tokenizer.apply_chat_template(msgs, tokenize=False)
    assert no_prompt.endswith("Hi!</s>")


def test_greedy_chat_generation_ends_with_eos(model_dir, tokenizer):
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    msgs = [{"role": "user", "content": "What does a cat say?"}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=64, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    new = out[0, ids.shape[1]:].tolist()
    assert tokenizer.eos_token_id in new
    answer = tokenizer.decode(new[: new.index(tokenizer.eos_token_id)])
    assert "cat" in answer.lower()
