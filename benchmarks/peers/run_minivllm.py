"""Runner: minivllm's offline LLM on the given token-id prompts (same protocol as peers)."""

import json
import sys
import time

from minivllm import LLM, SamplingParams
from minivllm.bench.sampling import offline_params


def main() -> None:
    spec = json.loads(sys.stdin.read())
    llm = LLM(spec["model"], dtype=spec.get("dtype", "float32"), max_model_len=spec["max_model_len"],
              max_num_seqs=max(spec["batch_sizes"]), kv_cache_space=2.0, swap_space=0.1,
              quantization=spec.get("quantization"),
              kv_cache_dtype=spec.get("kv_cache_dtype", "auto"))
    params = offline_params(spec.get("sampling", {"temperature": 0.0}),
                            llm.get_default_sampling_params(), max_tokens=spec["output_len"],
                            ignore_eos=True)
    # warm-up, on a prompt no batch holds (a measured prompt would hit the prefix cache)
    llm.generate([{"prompt_token_ids": spec["warmup_prompt"]}], SamplingParams(max_tokens=4),
                 use_tqdm=False)
    results = {}
    for batch in spec["batch_sizes"]:
        prompts = [{"prompt_token_ids": p} for p in spec["prompts"][:batch]]
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        results[str(batch)] = {"elapsed_s": elapsed, "output_tokens": tokens}
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
