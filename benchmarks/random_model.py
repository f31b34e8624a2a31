"""Random-weight models of known shapes, for benchmarks that need no download."""

from __future__ import annotations

from pathlib import Path

SHAPES = {
    # SmolLM-135M's architecture (HuggingFaceTB/SmolLM-135M), random weights.
    "smollm-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                        num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                        max_position_embeddings=2048, tie_word_embeddings=True,
                        rope_theta=10000.0, rms_norm_eps=1e-5),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                 max_position_embeddings=1024, tie_word_embeddings=True),
}


def save_random_model(shape: str, directory: Path, seed: int = 0) -> Path:
    """A LlamaForCausalLM of the named shape with random weights and a word-level
    tokenizer over its vocabulary (w0, w1, ...), saved in the Hugging Face layout."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    if (directory / "config.json").exists():
        return directory
    cfg = SHAPES[shape]
    torch.manual_seed(seed)
    config = LlamaConfig(**cfg, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(directory)
    save_word_tokenizer(directory, cfg["vocab_size"])
    return directory


def save_word_tokenizer(directory: Path, vocab_size: int) -> None:
    """A word-level tokenizer over vocab_size made-up words (w3, w4, ...)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(directory)

