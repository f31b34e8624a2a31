"""Multi-LoRA throughput: 64 concurrent requests spread over 8 adapters (rank 16, every
projection of every layer) against 64 requests of the base model, on SmolLM2-135M-Instruct,
offline (LLM.generate: the whole batch submitted at once, max_num_seqs 64). The base runs
on an engine without --enable-lora; the adapters on one with max_loras 8, so every step
mixes the 8. Runs alternate (base, lora, base, lora, ...); the ratio is the median of the
per-pair ratios of output tokens per second.

    python benchmarks/lora_throughput.py [--runs 3 --dtype bfloat16]

The adapters are random (A and B normal, PEFT's file layout), written once under
results/lora_adapters/; the model directory is results/smollm2-135m-instruct (needs the
real-models extra the first time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from datetime import datetime, timezone
from pathlib import Path

from minivllm import LLM, SamplingParams
from minivllm.bench.machine import cpu_description
from minivllm.bench.models import save_smollm2
from minivllm.bench.timing import timed
from minivllm.lora import LoRARequest
from minivllm.lora.peft_format import TARGETS, projection_shapes

ROOT = Path(__file__).resolve().parents[1]


def write_adapter(directory: Path, cfg, rank: int, seed: int) -> Path:
    """A random PEFT LoRA adapter of every projection of every layer."""
    import torch
    from safetensors.torch import save_file

    if (directory / "adapter_model.safetensors").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg.num_hidden_layers):
        for proj, block in TARGETS.items():
            fan_in, fan_out = projection_shapes(cfg)[proj]
            name = f"base_model.model.model.layers.{layer}.{block}.{proj}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator) \
                / fan_in ** 0.5
            tensors[f"{name}.lora_B.weight"] = 0.02 * torch.randn(fan_out, rank,
                                                                  generator=generator)
    save_file(tensors, directory / "adapter_model.safetensors")
    (directory / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
        "target_modules": list(TARGETS), "bias": "none"}))
    return directory


def run(llm: LLM, prompts: list[str], params: SamplingParams, loras) -> float:
    """Output tokens per second of one batch."""
    outputs, seconds = timed(llm.generate, prompts, params, use_tqdm=False, lora_request=loras)
    return sum(len(o.outputs[0].token_ids) for o in outputs) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--num-adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy; > 0: sampled (with --top-p), seeded per request")
    parser.add_argument("--top-p", type=float, default=1.0)
    args = parser.parse_args()

    model = save_smollm2(ROOT / "results" / "smollm2-135m-instruct")
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model)
    loras = [LoRARequest(f"a{i}", i + 1, str(write_adapter(
        ROOT / "results" / "lora_adapters" / f"r{args.rank}-{i}", cfg, args.rank, i)))
        for i in range(args.num_adapters)]
    common = dict(dtype=args.dtype, max_num_seqs=args.num_requests, num_kv_blocks=2048)
    base = LLM(str(model), **common)
    lora = LLM(str(model), enable_lora=True, max_loras=args.num_adapters,
               max_cpu_loras=args.num_adapters, max_lora_rank=args.rank, **common)
    prompts = [f"Request {i}: write a short story about a robot who learns to paint, "
               "with a beginning, a middle and an end." for i in range(args.num_requests)]
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=0,
                            max_tokens=args.max_tokens, ignore_eos=True)
    spread = [loras[i % len(loras)] for i in range(args.num_requests)]
    run(base, prompts[:8], params, None)  # warm both engines (kernels, first allocations)
    run(lora, prompts[:8], params, spread[:8])
    pairs = []
    for i in range(args.runs):
        base_tps = run(base, prompts, params, None)
        lora_tps = run(lora, prompts, params, spread)
        pairs.append((base_tps, lora_tps))
        print(f"run {i + 1}: base {base_tps:.1f} tok/s, {args.num_adapters} adapters "
              f"{lora_tps:.1f} tok/s, ratio {lora_tps / base_tps:.3f}", flush=True)
    ratio = statistics.median(lo / b for b, lo in pairs)
    print(f"\n{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {cpu_description()}")
    print(f"load average {os.getloadavg()[0]:.2f}; SmolLM2-135M-Instruct --dtype {args.dtype}, "
          f"{args.num_requests} requests x {args.max_tokens} tokens (EOS ignored), "
          f"{args.num_adapters} adapters of rank {args.rank}, temperature {args.temperature}, "
          f"top_p {args.top_p}")
    print(f"median ratio ({args.num_adapters} adapters / base output tok/s): {ratio:.3f}")


if __name__ == "__main__":
    main()
