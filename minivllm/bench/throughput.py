"""Offline throughput: N requests of fixed input/output length through the LLM class."""

from __future__ import annotations

import random
from dataclasses import dataclass

from minivllm.bench.timing import timed


@dataclass
class ThroughputResult:
    num_requests: int
    input_len: int
    output_len: int
    elapsed_s: float

    @property
    def output_tokens_per_s(self) -> float:
        return self.num_requests * self.output_len / self.elapsed_s

    @property
    def total_tokens_per_s(self) -> float:
        return self.num_requests * (self.input_len + self.output_len) / self.elapsed_s


def random_prompts(num: int, length: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(length)] for _ in range(num)]


def run_minivllm(model: str, prompts: list[list[int]] | None, output_len: int,
                 num_prompts: int = 0, input_len: int = 0, sampling: dict | None = None,
                 **engine_kwargs) -> ThroughputResult:
    """EOS ignored, every request exactly output_len tokens. Without `prompts`, num_prompts
    random prompts of input_len tokens. `sampling` (bench/sampling.py fields): None is greedy;
    a dict is set over the model's defaults (LLM.get_default_sampling_params), so {} means the
    model's defaults, as a server would apply them."""
    from minivllm import LLM, SamplingParams
    from minivllm.bench.sampling import offline_params

    llm = LLM(model, **engine_kwargs)
    prompts = prompts or random_prompts(num_prompts, input_len, llm.llm_engine.vocab_size)
    if sampling is None:
        params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    else:
        params = offline_params(sampling, llm.get_default_sampling_params(),
                                max_tokens=output_len, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(max_tokens=2),
                 use_tqdm=False)  # warm-up
    outputs, elapsed = timed(llm.generate, [{"prompt_token_ids": p} for p in prompts], params,
                             use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == output_len for o in outputs)
    return ThroughputResult(len(prompts), len(prompts[0]), output_len, elapsed)
