"""Peer runner: transformers `generate`, greedy (or the spec's sampling), the prompts of a
batch in one padded batch (all prompts have the same length, so no padding is wasted)."""

import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM

from minivllm.bench.sampling import hf_generate_kwargs


def main() -> None:
    spec = json.loads(sys.stdin.read())
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32).eval()
    n = spec["output_len"]
    sampling = hf_generate_kwargs(spec.get("sampling", {"temperature": 0.0}))
    results = {}
    with torch.inference_mode():
        model.generate(torch.tensor(spec["prompts"][:1]), max_new_tokens=4, do_sample=False)
        for batch in spec["batch_sizes"]:
            ids = torch.tensor(spec["prompts"][:batch])
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=n, min_new_tokens=n, pad_token_id=0, **sampling)
            elapsed = time.perf_counter() - start
            results[str(batch)] = {"elapsed_s": elapsed,
                                   "output_tokens": int(out.shape[0] * (out.shape[1] - ids.shape[1]))}
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
