r"""Train minivllm's built-in demo model: a tiny Llama on a seeded synthetic corpus.

    python scripts/train_demo_model.py      # the packaged model (~20 min on one idle core)
    python scripts/train_demo_model.py --out /tmp/m --steps 20 --num-samples 500 \
        --hidden 64 --layers 2              # a quick, tiny, useless one (~10 s)

Writes config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json and MODEL_CARD.md into --out. Same arguments, same files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_corpus import corpus  # noqa: E402

ROLES = ["<|system|>", "<|user|>", "<|assistant|>"]
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", *ROLES]  # ids 0..6
# Zephyr-style turns: "<|user|>\n...</s>\n<|assistant|>\n...</s>"; the last turn ends on EOS.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ ('\\n' if messages else '') + '<|assistant|>\\n' }}{% endif %}"
)
TOKENIZER_CONFIG = {
    "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
    "additional_special_tokens": ROLES, "add_bos_token": True, "add_eos_token": False,
    "model_max_length": 512, "clean_up_tokenization_spaces": False,
}
SAMPLE_PROMPTS = ["Once upon a time, there was a cat", "Once upon a time, there was a little boy"]
SAMPLE_CHATS = ["Tell me a story about a dog.", "What does a cow say?", "Hello!"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="minivllm/demo_model", help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-samples", type=int, default=40000, help="corpus size (samples)")
    p.add_argument("--vocab-size", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=160)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--steps", type=int, default=1300)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    return p.parse_args()


def build_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=CHAT_TEMPLATE,
                                   **TOKENIZER_CONFIG)


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    """tokenizer.json plus a hand-written tokenizer_config.json that old and new transformers
    both read (class PreTrainedTokenizerFast, the chat template inline, no .jinja file)."""
    tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **TOKENIZER_CONFIG,
              "chat_template": CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def render_plain(sample: str | list[dict[str, str]]) -> str:
    """Tokenizer-training text: chats are flattened to their contents."""
    return sample if isinstance(sample, str) else "\n".join(m["content"] for m in sample)


def render(tokenizer: PreTrainedTokenizerFast, sample: str | list[dict[str, str]]) -> str:
    """The full training text of one sample, from <s> up to and including the final </s>."""
    if isinstance(sample, str):
        return tokenizer.bos_token + sample + tokenizer.eos_token
    return tokenizer.apply_chat_template(sample, tokenize=False)


def packed_batches(ids: list[int], args: argparse.Namespace, gen: torch.Generator):
    """Endless random windows of seq_len + 1 tokens from the packed corpus."""
    data = torch.tensor(ids, dtype=torch.long)
    while True:
        starts = torch.randint(0, len(data) - args.seq_len - 1, (args.batch_size,), generator=gen)
        yield torch.stack([data[s : s + args.seq_len + 1] for s in starts.tolist()])


def train(model: LlamaForCausalLM, ids: list[int], args: argparse.Namespace) -> float:
    gen = torch.Generator().manual_seed(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))
    model.train()
    batches, ema, start = packed_batches(ids, args, gen), None, time.time()
    for step in range(1, args.steps + 1):
        batch = next(batches)
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % 25 == 0 or step == args.steps:
            print(f"step {step}/{args.steps} loss {ema:.4f} "
                  f"({time.time() - start:.0f}s)", flush=True)
    model.eval()
    return ema


def samples(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast) -> list[str]:
    """Markdown lines with greedy and sampled generations, for the model card."""
    torch.manual_seed(0)
    lines = []
    prompts = [(p, tokenizer(p, return_tensors="pt").input_ids) for p in SAMPLE_PROMPTS]
    for text in SAMPLE_CHATS:
        msgs = [{"role": "user", "content": text}]
        ids = tokenizer(tokenizer.apply_chat_template(msgs, tokenize=False,
                                                      add_generation_prompt=True),
                        add_special_tokens=False, return_tensors="pt").input_ids
        prompts.append((f"[chat] {text}", ids))
    for label, ids in prompts:
        for mode, kw in (("greedy", {"do_sample": False}),
                         ("sampled, T=0.8", {"do_sample": True, "temperature": 0.8})):
            out = model.generate(ids, max_new_tokens=160, pad_token_id=tokenizer.pad_token_id,
                                 **kw)[0, ids.shape[1]:]
            ended = "ends with EOS" if out[-1].item() == tokenizer.eos_token_id else "no EOS"
            lines.append(f"- **{label}** ({mode}, {ended}):\n  > "
                         + tokenizer.decode(out, skip_special_tokens=True).replace("\n", " "))
    return lines


def write_card(out: Path, facts: dict[str, str], sample_lines: list[str]) -> None:
    card = ["# minivllm demo model", "",
            "A tiny Llama trained from scratch by `scripts/train_demo_model.py` on a seeded,",
            "synthetic corpus of children's stories, question/answer pairs and chats",
            "(`scripts/demo_corpus.py`; no downloaded data). It is for demos and tests only.", ""]
    card += [f"- {k}: {v}" for k, v in facts.items()]
    card += ["", "## Samples (transformers `generate`)", "", *sample_lines, ""]
    (out / "MODEL_CARD.md").write_text("\n".join(card))


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    t0 = time.time()
    data = corpus(args.seed, args.num_samples)
    stories = sum(isinstance(s, str) and not s.startswith("Question:") for s in data)
    tokenizer = build_tokenizer([render_plain(s) for s in data], args.vocab_size)
    texts = [render(tokenizer, s) for s in data]
    ids = [i for enc in tokenizer(texts, add_special_tokens=False).input_ids for i in enc]
    print(f"corpus: {len(data)} samples, {len(ids)} tokens, vocab {len(tokenizer)}", flush=True)

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params} parameters", flush=True)
    t_train = time.time()
    loss = train(model, ids, args)
    train_s = time.time() - t_train

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.setdefault("rope_theta", 10000.0)  # legacy key, for loaders that read config.json
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    n_chats = sum(isinstance(s, list) for s in data)
    facts = {
        "command": "`python " + shlex.join(["scripts/train_demo_model.py", *sys.argv[1:]]) + "`",
        "corpus": f"{len(data)} samples ({stories} stories, {len(data) - stories - n_chats} "
                  f"Q/A, {n_chats} chats), {len(ids)} tokens, seed {args.seed}",
        "tokenizer": f"byte-level BPE, {len(tokenizer)} tokens, specials {' '.join(SPECIALS)}",
        "architecture": f"LlamaForCausalLM, hidden {args.hidden}, {args.layers} layers, "
                        f"4 heads, 2 KV heads, intermediate {3 * args.hidden}, tied embeddings",
        "parameters": f"{n_params:,}",
        "training": f"{args.steps} steps x {args.batch_size} x {args.seq_len} tokens, "
                    f"AdamW lr {args.lr}, 1 CPU thread",
        "final training loss": f"{loss:.4f} (EMA)",
        "wall time": f"{train_s / 60:.1f} min training, {(time.time() - t0) / 60:.1f} min total "
                     f"(machine load average at the end: {os.getloadavg()[0]:.1f})",
    }
    write_card(out, facts, samples(model, AutoTokenizer.from_pretrained(out)))
    for path in out.iterdir():
        path.chmod(0o644)  # save_pretrained writes model.safetensors as 0600
    print((out / "MODEL_CARD.md").read_text(), flush=True)


if __name__ == "__main__":
    main()
