"""What `--quantization gguf`'s kernel costs in accuracy on a real model: perplexity with
every linear (the tied LM head included) requantized to Q8_0 or Q4_0 blocks by the gguf
package, run by gguf_gemm.c (int8 activation blocks) and by the reference (the blocks
dequantized, products in fp32).

    python benchmarks/gguf_blocks_accuracy.py [--model <GGUF>] [--text <file>]

SmolLM2's file (the default) is Q4_1, so the blocks are requantized from its dequantized
weights: the Q4_0 rows add a second rounding to the file's, and only the kernel-vs-reference
difference within a type is the kernel's.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from quant_accuracy import TEXT, perplexity_with_linears
from real_model import smollm2_gguf

from minivllm.model.kernels.gguf_blocks import Q4_0, Q8_0
from minivllm.model.kernels.linear_gguf import BlockWeight, GGUFLinear

ROWS = [("fp32 (the file's weights dequantized)", None, False),
        ("Q8_0, reference", Q8_0, False), ("Q8_0, kernel", Q8_0, True),
        ("Q4_0, reference", Q4_0, False), ("Q4_0, kernel", Q4_0, True)]


def requantized_linear(qtype: int, kernel: bool):
    """A stand-in for decoder.linear: the weight as `qtype` blocks, in a GGUFLinear."""
    def make(weight, bias, fast, weights):
        raw = quantize(weight.float().numpy(), GGMLQuantizationType(qtype))
        return GGUFLinear(BlockWeight(qtype, torch.from_numpy(raw.copy())), bias,
                          use_kernel=kernel)
    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct's GGUF")
    parser.add_argument("--text", type=Path, default=TEXT)
    args = parser.parse_args()
    model = args.model or str(smollm2_gguf())
    text = args.text.read_text()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {Path(model).name}; "
          f"text: {args.text.name}")
    print("| linears | ppl | vs fp32 |\n|---|---|---|")
    base = None
    for name, qtype, kernel in ROWS:
        linear = None if qtype is None else requantized_linear(qtype, kernel)
        ppl = perplexity_with_linears(model, text, linear)
        base = base or ppl
        print(f"| {name} | {ppl:.3f} | {100 * (ppl / base - 1):+.2f}% |", flush=True)

if __name__ == "__main__":
    main()
