"""Embedding throughput: N short inputs pooled offline through LLM.embed (one batch through
the scheduler: each a pooling request, prefilled and pooled, never decoded).

    python benchmarks/embeddings_throughput.py [--model DIR --num-inputs 256 --input-len 16
                                                --pooler-config '{"pooling_type": "MEAN"}']

Prints inputs/s and tokens/s with the CPU model, its ISA flags and the load average: a
figure taken while other processes use the cores says so. Default model: stories260K from
the shared folder.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from minivllm import LLM
from minivllm.bench.machine import cpu_description, when_and_load
from minivllm.bench.throughput import random_prompts
from minivllm.bench.timing import timed

STORIES = Path(__file__).resolve().parents[1] / ".." / "shared" / "models" / "stories260K"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(STORIES.resolve()))
    parser.add_argument("--num-inputs", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=16, help="tokens per input")
    parser.add_argument("--pooler-config", default=None, help="vLLM's JSON, as the flag")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    args = parser.parse_args()
    llm = LLM(args.model, pooler_config=args.pooler_config, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens)
    prompts = [{"prompt_token_ids": p} for p in random_prompts(
        args.num_inputs, args.input_len, llm.llm_engine.vocab_size, seed=0)]
    llm.embed(prompts[:8], use_tqdm=False)  # warm-up: kernels built, first-step costs paid
    outputs, elapsed = timed(llm.embed, prompts, use_tqdm=False)
    tokens = sum(len(o.prompt_token_ids) for o in outputs)
    print(f"model {args.model}, {args.num_inputs} inputs of {args.input_len} tokens, "
          f"max_num_seqs={args.max_num_seqs}, max_num_batched_tokens="
          f"{args.max_num_batched_tokens}, pooler_config={args.pooler_config}")
    print(f"CPU: {cpu_description()}; {when_and_load()}")
    print(f"{len(outputs) / elapsed:.1f} inputs/s, {tokens / elapsed:.0f} tokens/s "
          f"({elapsed:.3f} s, dimension {len(outputs[0].outputs.embedding)})")


if __name__ == "__main__":
    main()
