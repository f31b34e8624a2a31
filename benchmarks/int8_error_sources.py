"""Where int8's error comes from on a real model: perplexity under fake-quantized linears.

    python benchmarks/int8_error_sources.py [--model <GGUF or dir>] [--text <file>]

Every decoder linear (qkv, o, gate_up, down; the LM head) is replaced by a torch linear
that rounds its weights and/or its input the way a scheme would (values rounded to the
integer grid and scaled back, the product in fp32), one scheme per row of the table, and the
model scores benchmarks/data/sqlite3_h_prose.txt (perplexity from prompt_logprobs, one
sequence per paragraph, as quant_accuracy.py). Schemes vary one thing at a time: weights
only or activations only, 7 or 8 bits, per output channel or per group of 32 input values,
per token or per group of 32 for activations, which layer types are quantized. Then, from
the fp32 run, how outlier-heavy each layer type's input is: the median over tokens of
max|x| / rms(x) (a per-token int8 step is max|x| / 127, so this is how many steps an
ordinary value spans, inverted), and the largest.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from quant_accuracy import TEXT, perplexity_with_linears
from real_model import smollm2_gguf

from minivllm.model.kernels.linear_int8 import Int8Linear

KINDS = ("qkv", "o", "gate_up", "down", "lm_head")
ALL = frozenset(KINDS)


def fake_quant(t: torch.Tensor, qmax: int, group: int | None) -> torch.Tensor:
    """Symmetric round to [-qmax, qmax] with one scale per row (group None) or per `group`
    consecutive values of a row, then back to fp32."""
    rows, k = t.shape
    g = group or k
    pad = -k % g
    blocks = F.pad(t, (0, pad)).view(rows, -1, g)
    amax = blocks.abs().amax(dim=2, keepdim=True)
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    q = torch.round(blocks / scale).clamp(-qmax, qmax) * scale
    return q.view(rows, -1)[:, :k]


class FakeQuantLinear:
    """y = fq(x) @ fq(w).T + bias (+ residual); w or x left in fp32 where its spec is None.
    A spec is (qmax, group)."""

    def __init__(self, weight, bias, w_spec, x_spec, stats: list | None = None) -> None:
        weight = weight.float()
        self.weight = fake_quant(weight, *w_spec) if w_spec else weight
        self.bias = None if bias is None else bias.float()
        self.x_spec, self.stats = x_spec, stats

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.stats is not None:
            amax = x.abs().amax(dim=1)
            rms = x.pow(2).mean(dim=1).sqrt().clamp_min(1e-20)
            self.stats.extend((amax / rms).tolist())
        if self.x_spec:
            x = fake_quant(x.float(), *self.x_spec)
        y = F.linear(x, self.weight, self.bias)
        return y if residual is None else residual + y


W7, W8, W8G = (63, None), (127, None), (127, 32)  # (qmax, group or None: per channel)
A8, A8G = (127, None), (127, 32)  # (qmax, group or None: per token)


def every(w_spec, x_spec, kinds=ALL, **others) -> dict:
    """kind -> (weights' spec, activations' spec) for `kinds`, overridden by `others`; a kind
    left out stays fp32."""
    return {**{k: (w_spec, x_spec) for k in kinds}, **others}


A8G16 = (127, 16)  # what int8_gemm.c runs, with W8G
SCHEMES = {
    "fp32": {},
    "before: W7 per-channel, A8 per-token": every(W7, A8),
    "weights only: W7 per-channel": every(W7, None),
    "weights only: W8 per-channel": every(W8, None),
    "weights only: W8 per-group-32": every(W8G, None),
    "activations only: A8 per-token": every(None, A8),
    "activations only: A8 per-group-32": every(None, A8G),
    "activations only: A8 per-group-16": every(None, A8G16),
    "W8 per-channel, A8 per-token": every(W8, A8),
    "W8 per-channel, A8 per-group-128": every(W8, (127, 128)),
    "W8 per-channel, A8 per-group-64": every(W8, (127, 64)),
    "W8 per-channel, A8 per-group-32": every(W8, A8G),
    "W8 per-group-32, A8 per-group-32 (Q8_0)": every(W8G, A8G),
    "W8 per-channel, A8 per-group-16": every(W8, A8G16),
    "W8 per-group-32, A8 per-group-16 (now)": every(W8G, A8G16),
    "now, as the engine runs it (int8_gemm.c)": "kernel",
    "now, as the engine runs it, lm_head fp32": "kernel, lm_head fp32",
    **{f"before, {k} only": every(W7, A8, {k}) for k in KINDS},
    **{f"now, {k} only": every(W8G, A8G16, {k}) for k in KINDS},
    "now, lm_head fp32": every(W8G, A8G16, ALL - {"lm_head"}),
}


def patched_linear(scheme: dict | str, stats: dict | None):
    """A stand-in for decoder.linear that names each linear by its order of creation (each
    dense layer makes qkv, o, gate_up, down) or, for the LM head, by its shape (a vocabulary
    over ten times the hidden size; gate_up's ratio is 5-8) and quantizes it as `scheme`
    says ("kernel": minivllm's Int8Linear, every linear, or all but the LM head)."""
    calls = [0]

    def make(weight, bias, fast, weights):
        if weight.shape[0] > 10 * weight.shape[1]:
            kind = "lm_head"
        else:
            kind = KINDS[calls[0] % 4]
            calls[0] += 1
        if scheme == "kernel" or scheme == "kernel, lm_head fp32" and kind != "lm_head":
            return Int8Linear(weight, bias)
        if isinstance(scheme, str):
            return FakeQuantLinear(weight, bias, None, None)
        bucket = None if stats is None else stats.setdefault(kind, [])
        return FakeQuantLinear(weight, bias, *scheme.get(kind, (None, None)), bucket)
    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct's GGUF")
    parser.add_argument("--text", type=Path, default=TEXT)
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES))
    args = parser.parse_args()
    model = args.model or str(smollm2_gguf())
    text = args.text.read_text()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {Path(model).name}; "
          f"text: {args.text.name}; linears fake-quantized in torch, products in fp32")
    print("| scheme | ppl | vs fp32 |\n|---|---|---|")
    base, stats = None, {}
    for name in ["fp32"] + [s for s in args.schemes if s != "fp32"]:
        ppl = perplexity_with_linears(model, text, patched_linear(
            SCHEMES[name], stats if name == "fp32" else None))
        base = base or ppl
        print(f"| {name} | {ppl:.3f} | {100 * (ppl / base - 1):+.2f}% |", flush=True)
    print("\n| layer input | median max\\|x\\|/rms(x) | largest |\n|---|---|---|")
    for kind in KINDS:
        values = stats.get(kind, [])
        if values:
            print(f"| {kind} | {statistics.median(values):.1f} | {max(values):.1f} |")
    assert not math.isnan(base)


if __name__ == "__main__":
    main()
