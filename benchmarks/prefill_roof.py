"""How fast a long prefill runs, against the GEMM roof of this CPU.

    python benchmarks/prefill_roof.py [--lengths 1024 4096] [--budgets 512 2048 4096]
                                      [--dtype bfloat16] [--repeats 3]

Model: SmolLM2-135M-Instruct (minivllm/bench/models.py). For each prompt length and step
budget (--max-num-batched-tokens: the chunk a step prefills), one request of random token ids
with max_tokens=1 and the prefix cache off: its TTFT is the prefill (the median of --repeats, after a warm-up).
Printed per row: prefill tokens/s, the model FLOPs it did per second (linears, 2 x
parameters per token; attention, causal, 4 x heads x head_dim x context per token and
layer), and the fraction of the roof that is. The roof is this CPU's speed at the
prefill's own GEMMs: the model's linear shapes (q/k/v, o, gate/up, down) with the chunk's
rows, through the kernel the engine runs them on at this dtype (AMX tiles with AMX, else
oneDNN), timed alone. What the prefill loses against the roof is everything else:
attention, norms, RoPE, the LM head, the step's Python.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from minivllm import LLM, SamplingParams
from minivllm.bench.machine import cpu_description, when_and_load
from minivllm.bench.models import save_smollm2
from minivllm.bench.timing import call_seconds, timed
from minivllm.model.kernels import library
from minivllm.model.linear.amx import AmxBf16Linear


def linear_shapes(config: dict) -> list[tuple[int, int]]:
    """(out, in) of one decoder layer's linears, q/k/v and gate/up fused as the engine runs
    them."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    qkv = (config["num_attention_heads"] + 2 * config["num_key_value_heads"]) * head_dim
    return [(qkv, hidden), (hidden, config["num_attention_heads"] * head_dim),
            (2 * inter, hidden), (hidden, inter)]


def prefill_flops(config: dict, length: int) -> float:
    """Linears and causal attention of a length-token prefill, all layers."""
    layers = config["num_hidden_layers"]
    params = sum(n * k for n, k in linear_shapes(config))
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    attention = 4 * config["num_attention_heads"] * head_dim * length * (length + 1) / 2
    return layers * (2 * params * length + attention)


def gemm_roof(config: dict, rows: int, dtype: torch.dtype, repeats: int) -> float:
    """FLOP/s of one layer's linears at `rows` rows, through the engine's kernel for dtype."""
    shapes = linear_shapes(config)
    x = {k: torch.randn(rows, k) for _, k in shapes}
    if dtype == torch.bfloat16 and library.amx():
        layers = [(AmxBf16Linear(torch.randn(n, k) * 0.02), k) for n, k in shapes]
    else:  # oneDNN, the x converted to the weights' dtype as linear.py does
        weights = [(torch.randn(n, k).to(dtype) * 0.02, k) for n, k in shapes]
        layers = [((lambda t, w=w: torch.nn.functional.linear(t.to(w.dtype), w)), k)
                  for w, k in weights]
    def one_layer():
        for layer, k in layers:
            layer(x[k])

    times = call_seconds(one_layer, repeats)
    return 2 * rows * sum(n * k for n, k in shapes) / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=Path("results/smollm2-135m-instruct"))
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--budgets", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = save_smollm2(args.model_dir)
    config = json.loads((model / "config.json").read_text())
    dtype = getattr(torch, args.dtype)
    print(f"# prefill against the GEMM roof; {when_and_load()}\n# {cpu_description()}\n"
          f"# SmolLM2-135M-Instruct, dtype {args.dtype}, {torch.get_num_threads()} threads, "
          f"kernels: {'AMX tiles' if dtype == torch.bfloat16 and library.amx() else 'oneDNN'}\n")
    print("| prompt | step budget | prefill s | tok/s | model GFLOP/s | GEMM roof GFLOP/s "
          "(at the chunk's rows) | of roof |\n|---|---|---|---|---|---|---|")
    max_len = max(args.lengths) + 8
    for budget in args.budgets:
        llm = LLM(str(model), dtype=args.dtype, max_model_len=max_len,
                  max_num_batched_tokens=budget, enable_prefix_caching=False,
                  kv_cache_space=2.0, swap_space=0.1)
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        for length in args.lengths:
            # random token ids: a prefill's compute does not depend on the text (and the
            # project's prose is shorter than 4,096 tokens)
            prompts = torch.randint(100, config["vocab_size"] - 100, (args.repeats + 1, length),
                                    generator=torch.Generator().manual_seed(length)).tolist()
            times = [timed(llm.generate, [{"prompt_token_ids": prompt}], params,
                           use_tqdm=False)[1] for prompt in prompts]  # the first: warm-up
            seconds = statistics.median(times[1:])
            flops = prefill_flops(config, length) / seconds
            roof = gemm_roof(config, min(budget, length), dtype, args.repeats + 2)
            print(f"| {length} | {budget} | {seconds:.3f} | {length / seconds:,.0f} | "
                  f"{flops / 1e9:.0f} | {roof / 1e9:.0f} | {flops / roof:.0%} |", flush=True)
        del llm


if __name__ == "__main__":
    main()
