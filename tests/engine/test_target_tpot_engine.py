"""--target-tpot-ms in the real engine: the scheduler learns its step times from the forward
passes the engine times, and the outputs are the same tokens as without the knob."""

from __future__ import annotations

from minivllm import LLM, SamplingParams
from tests.conftest import assert_all_blocks_free


def test_the_engine_times_its_steps_for_the_scheduler_and_outputs_do_not_change(stories_dir):
    prompts = [f"Once upon a time, {name} went to the park and" * 3
               for name in ("Lily", "Tom", "Sue", "Ben", "Max", "Ann")]
    params = SamplingParams(temperature=0, max_tokens=24)
    outputs = {}
    for target in (None, 5.0):
        llm = LLM(model=str(stories_dir), block_size=4, max_num_batched_tokens=64,
                  max_num_seqs=4, target_tpot_ms=target)
        outputs[target] = [o.outputs[0].token_ids
                           for o in llm.generate(prompts, params, use_tqdm=False)]
        assert_all_blocks_free(llm)
    cost = llm.llm_engine.core.scheduler.step_cost
    assert cost.ready and cost.num_steps >= 24 and cost.coefficients[0] > 0
    assert outputs[5.0] == outputs[None]
