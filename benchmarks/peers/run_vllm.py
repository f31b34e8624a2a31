"""Peer runner: vLLM's CPU build, offline LLM.generate on the given token-id prompts.
Run with the peer's own venv python; prints one JSON line with the timing."""

import json
import sys
import time

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt


def main() -> None:
    spec = json.loads(sys.stdin.read())
    llm = LLM(model=spec["model"], dtype=spec.get("dtype", "float32"), max_model_len=spec["max_model_len"],
              max_num_seqs=max(spec["batch_sizes"]), seed=0)
    sampling = spec.get("sampling", {"temperature": 0.0})  # vLLM's field names
    params = SamplingParams(**sampling, max_tokens=spec["output_len"], ignore_eos=True)
    results = {}
    # warm-up, on a prompt no batch holds (a measured prompt would hit the prefix cache)
    llm.generate([TokensPrompt(prompt_token_ids=spec["warmup_prompt"])],
                 SamplingParams(max_tokens=4), use_tqdm=False)
    for batch in spec["batch_sizes"]:
        prompts = [TokensPrompt(prompt_token_ids=p) for p in spec["prompts"][:batch]]
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        results[str(batch)] = {"elapsed_s": elapsed, "output_tokens": tokens}
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
