"""Speculative decoding at batch 1 and 64: output tok/s with drafts against none, in one
process, the engines alternating (A B C A B C ...), each one's median ratio to none.

    python benchmarks/spec_decode.py [--model smollm2|qwen2.5-coder|PATH] [--repeats 3] \
        [--dtype bfloat16] [--speculative-config JSON ...] [--draft-layers N] \
        [--max-prompts N] [--only NAME] [--num-threads N]

--model: SmolLM2-135M-Instruct (default, fp32 safetensors built from its GGUF file),
qwen2.5-coder (Qwen2.5-Coder-0.5B-Instruct's Q4_K_M GGUF file, run as its blocks), or a
model directory or GGUF file. One engine per --speculative-config (default: ngram, then
suffix). A draft_model config without "model" drafts with SmolLM2's first --draft-layers
layers (a test-built draft: no smaller model of its family installs here).

Workloads, from --prompts (default: benchmarks/data/spec_prompts.jsonl, for qwen2.5-coder
spec_prompts_code.jsonl; their .md says what they hold), one per kind and split:
- repeat, batch 1: answers that repeat the prompt (rewrite, correct, quote, code edit), one
  request at a time — where prompt lookup pays;
- open, batch 1: open chat questions — where drafts are rarely right (the adaptive length);
- "held out" beside a name: prompts of a split nothing was tuned on;
- batch 64: 64 random 128-token prompts, 128 output tokens, EOS ignored (the standard
  trace's shape) — where disable_by_batch_size turns drafts off.
Greedy by default, or sampled (--temperature, --top-p; seeded); either way the engines'
outputs must be the same tokens; the script counts the requests whose output differs (a
near-tie decided differently by a one-token decode and a verification row, see
model/spec_verify.py) and prints, per engine and workload, tokens per forward pass, the
drafts accepted, tokens per verification (accepted drafts + 1), and the verification cost
the engine measured: its decode steps' seconds as c_step + c_row x rows, and one more row
as a fraction of a one-row step (what the adaptive draft length prices drafts by).
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import datetime, timezone
from pathlib import Path

from minivllm import LLM, SamplingParams
from minivllm.bench.machine import cpu_description
from minivllm.bench.models import save_first_layers, save_smollm2
from minivllm.bench.qwen25_coder import qwen25_coder_gguf
from minivllm.bench.timing import ratio_summary, timed
from minivllm.core.draft_proposers import SuffixProposer

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
# --model keyword -> (the model, built or fetched on first use; its default prompts)
MODELS = {
    "smollm2": (lambda: save_smollm2(ROOT / "results" / "smollm2-135m-instruct"),
                DATA / "spec_prompts.jsonl"),
    "qwen2.5-coder": (qwen25_coder_gguf, DATA / "spec_prompts_code.jsonl"),
}
DEFAULT_SPECS = [
    '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, '
    '"prompt_lookup_max": 5}',
    '{"method": "suffix", "num_speculative_tokens": 6, "suffix_decoding_max_spec_factor": 2}',
]


def workloads(tokenizer, prompts_file: Path, max_prompts: int | None, max_tokens: int,
              temperature: float, top_p: float) -> dict[str, tuple[list, SamplingParams, bool]]:
    """name -> (prompts, as token ids, params, one at a time?)."""
    rows = [json.loads(line) for line in prompts_file.read_text().splitlines()]

    def chat(text: str) -> dict:
        templated = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                  add_generation_prompt=True, tokenize=False)
        return {"prompt_token_ids": tokenizer.encode(templated, add_special_tokens=False)}
    # seeded when sampled: the two engines' outputs are then the same tokens too
    greedy = SamplingParams(temperature=temperature, top_p=top_p, seed=0, max_tokens=max_tokens)
    chats: dict[str, list] = {}  # by kind and split, in the file's order
    for r in rows:
        held_out = " held out" if r.get("split") == "heldout" else ""
        chats.setdefault(f"{r['kind']}{held_out}, batch 1", []).append(chat(r["prompt"]))
    named = {name: (p[:max_prompts], greedy, True) for name, p in chats.items()}
    import random
    rng = random.Random(0)
    vocab = tokenizer.vocab_size
    batch = [{"prompt_token_ids": [rng.randrange(100, vocab) for _ in range(128)]}
             for _ in range(64)]
    named["128/128, batch 64"] = (batch, SamplingParams(
        temperature=temperature, top_p=top_p, seed=0, max_tokens=128, ignore_eos=True), False)
    return named


def verify_cost(llm: LLM) -> str:
    """The engine's fit of its decode steps' seconds (core/spec_decoding.py)."""
    spec_decoding = llm.llm_engine.core.scheduler.spec_decoding
    if not spec_decoding.step_cost.ready:
        return "verify cost not measured yet"
    c_step, c_row = spec_decoding.step_cost.coefficients[:2]
    return (f"step {1e3 * c_step:.1f} ms + {1e3 * c_row:.2f} ms a row (a row "
            f"+{100 * spec_decoding.row_cost(1):.1f}% of a one-row step)")


def forget_recent_outputs(llm: LLM) -> None:
    """A suffix engine starts each timed run with no outputs of earlier runs cached: the
    same prompts again would find their own answers there."""
    spec_decoding = llm.llm_engine.core.scheduler.spec_decoding
    if isinstance(spec_decoding.proposer, SuffixProposer):
        spec_decoding.proposer = SuffixProposer(spec_decoding.config)


def generate(llm: LLM, prompts: list, params: SamplingParams, one_at_a_time: bool) -> list:
    if one_at_a_time:
        return [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
    return llm.generate(prompts, params, use_tqdm=False)


def rate_and_ids(llm: LLM, prompts: list, params: SamplingParams, one_at_a_time: bool):
    """(output tokens per second, outputs' token ids)."""
    forget_recent_outputs(llm)
    outputs, seconds = timed(generate, llm, prompts, params, one_at_a_time)
    ids = [o.outputs[0].token_ids for o in outputs]
    return sum(map(len, ids)) / seconds, ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2",
                        help=f"{' or '.join(MODELS)} (default: smollm2), or a model "
                        "directory or GGUF file")
    parser.add_argument("--prompts", type=Path, default=None,
                        help="JSONL of kind / split / prompt (default: the model's, see above)")
    parser.add_argument("--max-prompts", type=int, default=None,
                        help="the first N prompts of each batch-1 workload (a smoke run)")
    parser.add_argument("--num-threads", type=int, default=None,
                        help="a fixed intra-op thread count for every engine (default: each "
                        "follows the cores other processes leave free; a prompt's prefill "
                        "then sums in an order that depends on the count of the moment, and "
                        "on a busy host greedy answers can differ between engines for that "
                        "alone)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default=None,
                        help="default: bfloat16 where the CPU has AVX512-BF16, else float32 "
                        "(a GGUF file: float32 activations beside its blocks)")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--speculative-config", action="append", default=None,
                        help="one engine per flag (default: ngram k=4, then suffix k=6)")
    parser.add_argument("--draft-layers", type=int, default=8,
                        help="draft_model without a model: SmolLM2's first N of 30 layers")
    parser.add_argument("--only", default=None, help="run the workloads whose name has this")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    args = parser.parse_args()
    cpu = cpu_description()
    build, prompts_file = MODELS.get(args.model, (lambda: Path(args.model),
                                                  DATA / "spec_prompts.jsonl"))
    model, prompts_file = build(), args.prompts or prompts_file
    gguf = model.suffix == ".gguf"
    dtype = args.dtype or ("bfloat16" if "avx512_bf16" in cpu and not gguf else "float32")
    specs = [json.loads(text) for text in args.speculative_config or DEFAULT_SPECS]
    for spec in specs:
        if spec.get("method") == "draft_model" and "model" not in spec:
            spec["model"] = str(save_first_layers(model, args.draft_layers))
    engines = {"none": LLM(model=str(model), dtype=dtype, num_threads=args.num_threads)}
    for spec in specs:
        engines[f"{len(engines)}:{spec.get('method', 'ngram')}"] = LLM(
            model=str(model), dtype=dtype, num_threads=args.num_threads,
            speculative_config=spec)
    tokenizer = engines["none"].get_tokenizer()
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()}, {cpu}")
    print(f"model {model}, prompts {prompts_file.name}")
    print(f"dtype {dtype}; engines: none, " + ", ".join(
        f"{key} {json.dumps(spec)}" for key, spec in zip(list(engines)[1:], specs)))
    print(f"temperature {args.temperature}, top_p {args.top_p}")
    for name, (prompts, params, one) in workloads(tokenizer, prompts_file, args.max_prompts,
                                                  args.max_tokens, args.temperature,
                                                  args.top_p).items():
        if args.only and args.only not in name:
            continue
        for llm in engines.values():  # warm-up, not measured
            llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=8),
                         use_tqdm=False)
        rates = {k: [] for k in engines}
        outputs = {}
        before = {key: llm.stats() for key, llm in engines.items()}
        steps = {key: -llm.llm_engine.core.scheduler.step_count for key, llm in engines.items()}
        for _ in range(args.repeats):
            for key, llm in engines.items():  # alternating
                rate, outputs[key] = rate_and_ids(llm, prompts, params, one)
                rates[key].append(rate)
        tokens = sum(map(len, outputs["none"]))
        for key, llm in engines.items():  # forward passes: a noise-free measure of the gain
            steps[key] = (steps[key] + llm.llm_engine.core.scheduler.step_count) / args.repeats
        print(f"{name}: none {' '.join(f'{r:.1f}' for r in rates['none'])} tok/s, "
              f"{tokens / steps['none']:.2f} tokens per step", flush=True)
        for key in list(engines)[1:]:
            after = engines[key].stats()
            ratios = [s / n for s, n in zip(rates[key], rates["none"])]
            differ = sum(a != b for a, b in zip(outputs[key], outputs["none"]))
            drafted = after.spec_num_draft_tokens - before[key].spec_num_draft_tokens
            accepted = after.spec_num_accepted_tokens - before[key].spec_num_accepted_tokens
            drafts = after.spec_num_drafts - before[key].spec_num_drafts
            print(f"  {key} {' '.join(f'{r:.1f}' for r in rates[key])} tok/s, "
                  f"{sum(map(len, outputs[key])) / steps[key]:.2f} tokens per step; ratio median "
                  f"{ratio_summary(ratios)}; "
                  f"drafted {drafted}, accepted {accepted} "
                  f"({100 * accepted / max(drafted, 1):.0f}%, tokens per verification "
                  f"{1 + accepted / max(drafts, 1):.2f}); outputs differing "
                  f"{differ}/{len(prompts)}; {verify_cost(engines[key])}", flush=True)
    print(f"done, load {os.getloadavg()}")


if __name__ == "__main__":
    main()
