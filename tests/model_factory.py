"""Tiny random-weight Hugging Face models, built and saved at test time."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

VOCAB_SIZE = 512
SHARED_MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
STORIES = SHARED_MODELS / "stories260K"

_COMMON = dict(
    vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    bos_token_id=1, eos_token_id=2, initializer_range=0.2,
)

CONFIGS = {
    "llama": lambda: LlamaConfig(**_COMMON, tie_word_embeddings=True, rope_theta=10000.0),
    "llama3-rope": lambda: LlamaConfig(**_COMMON, head_dim=32, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}),
    "qwen2": lambda: Qwen2Config(**_COMMON, tie_word_embeddings=False),
    "mistral": lambda: MistralConfig(**_COMMON, sliding_window=None),
}


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over VOCAB_SIZE made-up words (w3, w4, ...)."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, VOCAB_SIZE)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def save_tiny_model(kind: str, directory: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    config = CONFIGS[kind]()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory)
    word_tokenizer().save_pretrained(directory)
    return directory


def hf_greedy(model_dir: Path, prompt_ids: list[int], max_new_tokens: int
              ) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation (ignoring EOS) and each chosen token's logprob."""
    model = _load(model_dir)
    ids = torch.tensor([prompt_ids])
    tokens, logprobs = [], []
    past = None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            out = model(ids if past is None else ids[:, -1:], past_key_values=past,
                        use_cache=True)
            past = out.past_key_values
            lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            token = int(lp.argmax())
            tokens.append(token)
            logprobs.append(float(lp[token]))
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return tokens, logprobs


def hf_prompt_logprobs(model_dir: Path, prompt_ids: list[int]) -> list[float]:
    model = _load(model_dir)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [float(lp[i, prompt_ids[i + 1]]) for i in range(len(prompt_ids) - 1)]


_MODELS: dict[Path, torch.nn.Module] = {}


def _load(model_dir: Path):
    if model_dir not in _MODELS:
        _MODELS[model_dir] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return _MODELS[model_dir].eval()
