"""Tiny random-weight Hugging Face models, built and saved at test time."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Phi3Config,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

VOCAB_SIZE = 512
SHARED_MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
STORIES = SHARED_MODELS / "stories260K"

COMMON = dict(
    vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    bos_token_id=1, eos_token_id=2, initializer_range=0.2,
)

CONFIGS = {
    "llama": lambda: LlamaConfig(**COMMON, tie_word_embeddings=True, rope_theta=10000.0),
    "llama3-rope": lambda: LlamaConfig(**COMMON, head_dim=32, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}),
    "qwen2": lambda: Qwen2Config(**COMMON, tie_word_embeddings=False),
    # a window shorter than most prompts, on every layer (Mistral has no layer_types)
    "mistral": lambda: MistralConfig(**COMMON, sliding_window=16),
    # head_dim not hidden / heads; saved in shards with an index (SHARDED)
    "qwen3": lambda: Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=False),
    "phi3": lambda: Phi3Config(**COMMON, pad_token_id=0, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 256,
        "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
        "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0, 64.0]}),
    # Phi-4-mini's partial rotary: RoPE on the first 3/4 of each head
    "phi4-mini": lambda: Phi3Config(**COMMON, pad_token_id=0, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}),
    "mixtral": lambda: MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2),
    # unnormalized top-k weights (Mixtral's are), and a dense MLP on layer 1
    "qwen3_moe": lambda: Qwen3MoeConfig(**COMMON, num_experts=4, num_experts_per_tok=2,
                                        moe_intermediate_size=48, norm_topk_prob=False,
                                        mlp_only_layers=[1]),
    # small windows and caps, so that they change the output (untied: a tied head over
    # Gemma's sqrt(hidden)-scaled embeddings just repeats the last token at this size)
    "gemma2": lambda: Gemma2Config(**COMMON, head_dim=16, sliding_window=8,
                                   query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                                   final_logit_softcapping=10.0, tie_word_embeddings=False),
    "gemma3": lambda: Gemma3TextConfig(
        **COMMON, head_dim=16, sliding_window=8, query_pre_attn_scalar=24,
        tie_word_embeddings=False, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}}),
}
SHARDED = {"qwen3"}


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over VOCAB_SIZE made-up words (w3, w4, ...)."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, VOCAB_SIZE)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def save_tiny_model(kind: str, directory: Path, seed: int = 0) -> Path:
    return save_model(CONFIGS[kind](), directory, seed, sharded=kind in SHARDED)


def save_model(config, directory: Path, seed: int = 0, sharded: bool = False) -> Path:
    """A random-weight model of a config, with the word tokenizer, saved to directory."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory, max_shard_size="100KB" if sharded else "5GB")
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


def hf_greedy_batch(model_dir: Path, prompts: list[list[int]], max_new_tokens: int
                    ) -> list[tuple[list[int], list[float]]]:
    """hf_greedy for every prompt in one left-padded batch: a forward per step, not per
    prompt and step (8x fewer; the references of the architecture tests are most of their
    time)."""
    return greedy_batch(_load(model_dir), prompts, max_new_tokens)


def greedy_batch(model, prompts: list[list[int]], max_new_tokens: int, eos: int | None = None
                 ) -> list[tuple[list[int], list[float]]]:
    """A transformers model's greedy continuations of a left-padded batch (padding masked,
    positions counting real tokens only), each up to max_new_tokens or its first `eos`, and
    each chosen token's logprob."""
    width = max(map(len, prompts))
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    results = [([], []) for _ in prompts]
    past = None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1]:]
            out = model(ids, attention_mask=mask, position_ids=positions, past_key_values=past,
                        use_cache=True)
            past = out.past_key_values
            lp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
            ids = lp.argmax(-1, keepdim=True)
            for (tokens, logprobs), row, token in zip(results, lp, ids[:, 0].tolist()):
                if eos is None or not tokens or tokens[-1] != eos:
                    tokens.append(token)
                    logprobs.append(float(row[token]))
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
    return results


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
