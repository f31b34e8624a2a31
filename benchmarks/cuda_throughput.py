"""The engine on a CUDA GPU against transformers' `generate` on the same GPU, offline:
a Qwen2.5-0.5B-shaped model (its real dimensions, random weights: the speed of a shape does
not depend on its values) in bf16, B prompts of 128 random tokens, 128 output tokens each,
EOS ignored, greedy.

    python benchmarks/cuda_throughput.py [--batches 1 32 128] [--rounds 2]

Prints the GPU, then per batch size each engine's output tok/s (the best of the rounds, the
engines alternating) and the ratio. transformers is the peer here because vLLM's CUDA wheels
cannot be installed on the lent GPU machine (no registry reachable from it).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

from minivllm import LLM, SamplingParams

QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                  num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  max_position_embeddings=4096, rope_theta=1e6, tie_word_embeddings=True,
                  bos_token_id=1, eos_token_id=2)


def save_model(directory: Path) -> Path:
    """The shape with random weights, and a word-level tokenizer covering its vocabulary."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**QWEN25_05B), dtype=torch.bfloat16)
    model.save_pretrained(directory)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, QWEN25_05B["vocab_size"])})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(directory)
    return directory


def prompts(batch: int, length: int) -> list[list[int]]:
    rng = random.Random(batch)
    return [[rng.randrange(3, 50000) for _ in range(length)] for _ in range(batch)]


def minivllm_seconds(llm, batch, in_len, out_len) -> float:
    params = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts(batch, in_len)], params,
                        use_tqdm=False)
    torch.cuda.synchronize()
    assert all(len(o.outputs[0].token_ids) == out_len for o in outs)
    return time.perf_counter() - start


def transformers_seconds(model, batch, in_len, out_len) -> float:
    ids = torch.tensor(prompts(batch, in_len), device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=out_len, min_new_tokens=out_len, pad_token_id=0)
    torch.cuda.synchronize()
    assert out.shape == (batch, in_len + out_len)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 32, 128])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    print(f"GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, "
          f"{props.multi_processor_count} SMs; torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        path = save_model(Path(tmp) / "qwen25-05b-shape")
        llm = LLM(str(path), dtype="bfloat16", max_num_seqs=max(args.batches),
                  max_num_batched_tokens=8192, kv_cache_space=8)
        peer = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
        minivllm_seconds(llm, 2, 16, 8), transformers_seconds(peer, 2, 16, 8)  # warm up
        rows = []
        for batch in args.batches:
            ours, theirs = [], []
            for _ in range(args.rounds):
                ours.append(minivllm_seconds(llm, batch, args.input_len, args.output_len))
                theirs.append(transformers_seconds(peer, batch, args.input_len, args.output_len))
            tokens = batch * args.output_len
            rows.append(dict(batch=batch, minivllm_tok_s=tokens / min(ours),
                             transformers_tok_s=tokens / min(theirs)))
    print(f"{'batch':>5} {'minivllm tok/s':>15} {'transformers tok/s':>19} {'ratio':>6}")
    for r in rows:
        print(f"{r['batch']:>5} {r['minivllm_tok_s']:>15.1f} {r['transformers_tok_s']:>19.1f} "
              f"{r['minivllm_tok_s'] / r['transformers_tok_s']:>5.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(gpu=props.name, rows=rows), indent=1))


if __name__ == "__main__":
    main()
