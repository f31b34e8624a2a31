"""Which grammar library: xgrammar against llguidance on this CPU, for one JSON schema.

    python benchmarks/grammar_libs.py [--vocab 32000] [--tokens 64] [--rounds 3]

The tokenizer is a byte-level BPE of --vocab tokens trained here on Python's own sources
(no tokenizer of a real model can be downloaded here), plus the demo model's 920-token one.
For each library: the time to compile the schema for the tokenizer (cold: a fresh compiler
or matcher, nothing cached) and the time per token to compute the next-token bitmask and
advance the matcher, over a fixed JSON document that satisfies the schema, tokenized by the
tokenizer itself. Rounds alternate the two libraries; medians are printed with date and
load. xgrammar is optional (it is not a dependency of minivllm: pip install xgrammar
--no-deps apache-tvm-ffi torch==2.13.0 to run it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {"type": "object", "properties": {
            "street": {"type": "string"}, "city": {"type": "string"},
            "country": {"enum": ["FR", "DE", "US", "JP"]}},
            "required": ["street", "city", "country"]},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "address", "active"],
}
DOCUMENT = json.dumps({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org",
                       "tags": ["math", "engines", "poetry"],
                       "address": {"street": "12 St James's Square", "city": "London",
                                   "country": "US"}, "active": True})


def trained_bpe(vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on the standard library's .py files."""
    sources = sorted(Path(os.__file__).parent.glob("*.py"))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([str(p) for p in sources], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def run_llguidance(hf_tok, tokens: list[int]) -> tuple[float, float]:
    import llguidance
    import llguidance.hf
    import llguidance.torch as llg_torch

    lltok = llguidance.hf.from_tokenizer(hf_tok, n_vocab=len(hf_tok))
    start = time.perf_counter()
    matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(SCHEMA))
    mask = llg_torch.allocate_token_bitmask(1, len(hf_tok))
    llg_torch.fill_next_token_bitmask(matcher, mask, 0)  # the lexer is built lazily
    compiled = time.perf_counter()
    for t in tokens:
        llg_torch.fill_next_token_bitmask(matcher, mask, 0)
        assert matcher.consume_token(t), matcher.get_error()
    done = time.perf_counter()
    return compiled - start, (done - compiled) / len(tokens)


def run_xgrammar(hf_tok, tokens: list[int]) -> tuple[float, float]:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(hf_tok, vocab_size=len(hf_tok))
    start = time.perf_counter()
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    matcher = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(SCHEMA)))
    mask = xgr.allocate_token_bitmask(1, len(hf_tok))
    compiled = time.perf_counter()
    for t in tokens:
        matcher.fill_next_token_bitmask(mask, 0)
        assert matcher.accept_token(t)
    done = time.perf_counter()
    return compiled - start, (done - compiled) / len(tokens)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load "
          f"{os.getloadavg()[0]:.2f}, python {sys.version.split()[0]}")
    demo = AutoTokenizer.from_pretrained(Path(__file__).parents[1] / "minivllm" / "demo_model")
    for label, hf_tok in [("demo 920", demo), (f"bpe {args.vocab}", trained_bpe(args.vocab))]:
        tokens = hf_tok.encode(DOCUMENT, add_special_tokens=False)
        results: dict[str, list[tuple[float, float]]] = {"llguidance": [], "xgrammar": []}
        for _ in range(args.rounds):
            results["llguidance"].append(run_llguidance(hf_tok, tokens))
            results["xgrammar"].append(run_xgrammar(hf_tok, tokens))
        for lib, runs in results.items():
            compile_ms = statistics.median(c for c, _ in runs) * 1e3
            token_us = statistics.median(t for _, t in runs) * 1e6
            print(f"{label:>10} {lib:>10}: compile {compile_ms:8.1f} ms, mask+advance "
                  f"{token_us:7.1f} us/token ({len(tokens)} tokens)")


if __name__ == "__main__":
    main()
