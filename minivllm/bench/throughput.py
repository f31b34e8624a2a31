"""Offline throughput: N requests of fixed input/output length through the LLM class."""

from __future__ import annotations

import time
from dataclasses import dataclass


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


def run_minivllm(model: str, prompts: list[list[int]], output_len: int, **engine_kwargs
                 ) -> ThroughputResult:
    from minivllm import LLM, SamplingParams

    llm = LLM(model, **engine_kwargs)
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(max_tokens=2),
                 use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == output_len for o in outputs)
    return ThroughputResult(len(prompts), len(prompts[0]), output_len, elapsed)
