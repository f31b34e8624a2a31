"""LoRA adapters through the engine on stories260K (a real trained model, tiny): greedy
output token-identical to transformers + peft on the same adapters, alone and in batches
mixing adapters and the base model; max_loras; the prefix cache never shared across
adapters; adapters released and evicted; bad adapters refused by name."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.lora import LoRARequest
from tests.conftest import assert_all_blocks_free
from tests.lora_utils import PeftReference, edit_config, make_adapter

PROMPTS = ["Once upon a time", "The little dog ran to the park and saw",
           "Lily and Ben were friends. One day they", "The sun"]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def adapters(stories_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return [make_adapter(stories_dir, root / f"a{i}", seed=i, rank=4 + 4 * (i % 2), b_std=0.3,
                         use_rslora=i == 2) for i in range(3)]


@pytest.fixture(scope="module")
def reference(stories_dir):
    return PeftReference(stories_dir)


@pytest.fixture(scope="module")
def llm(stories_dir):
    return LLM(str(stories_dir), enable_lora=True, max_loras=4, max_lora_rank=8,
               dtype="float32", num_kv_blocks=256)


def lora(adapters, i: int) -> LoRARequest:
    return LoRARequest(f"a{i}", i + 1, str(adapters[i]))


def greedy(llm, prompts, loras):
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS),
                        use_tqdm=False, lora_request=loras)
    return [o.outputs[0].token_ids for o in outs]


def expected(reference, llm, prompts, adapter_paths):
    tok = llm.get_tokenizer()
    return [reference.generate(a, tok(p).input_ids, MAX_TOKENS)
            for p, a in zip(prompts, adapter_paths)]


def test_each_adapter_alone_equals_peft(llm, adapters, reference):
    for i in range(len(adapters)):
        got = greedy(llm, PROMPTS, lora(adapters, i))
        assert got == expected(reference, llm, PROMPTS, [adapters[i]] * len(PROMPTS)), i
    base = greedy(llm, PROMPTS, None)
    assert base == expected(reference, llm, PROMPTS, [None] * len(PROMPTS))
    assert base != greedy(llm, PROMPTS, lora(adapters, 0))  # the adapter changes the output
    assert_all_blocks_free(llm)


def test_a_batch_mixing_adapters_and_the_base_equals_peft(llm, adapters, reference):
    prompts = PROMPTS * 2
    picks = [0, 1, 2, None, 2, None, 1, 0]
    got = greedy(llm, prompts, [None if i is None else lora(adapters, i) for i in picks])
    want = expected(reference, llm, prompts, [None if i is None else adapters[i]
                                              for i in picks])
    assert got == want


def test_max_loras_bounds_the_adapters_running_at_once(stories_dir, adapters, reference):
    llm = LLM(str(stories_dir), enable_lora=True, max_loras=1, max_cpu_loras=2,
              dtype="float32", num_kv_blocks=256)
    seen = []
    runner = llm.llm_engine.core.runner
    original = runner.lora.set_step

    def spy(lora_ids, query_start_loc):
        seen.append(set(lora_ids) - {0})
        original(lora_ids, query_start_loc)

    runner.lora.set_step = spy
    picks = [0, 1, 2, 0]
    got = greedy(llm, PROMPTS, [lora(adapters, i) for i in picks])
    assert got == expected(reference, llm, PROMPTS, [adapters[i] for i in picks])
    assert seen and max(len(s) for s in seen) == 1
    assert len({frozenset(s) for s in seen}) == 3  # each adapter ran, one at a time
    assert len(runner.lora.adapters) <= 2 and not runner.lora.holders  # evicted, released


def test_the_prefix_cache_is_never_shared_across_adapters(llm, adapters, reference):
    prompt = " ".join(PROMPTS) * 2  # several full blocks
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    first = llm.generate([prompt], params, use_tqdm=False, lora_request=lora(adapters, 0))[0]
    again = llm.generate([prompt], params, use_tqdm=False, lora_request=lora(adapters, 0))[0]
    other = llm.generate([prompt], params, use_tqdm=False, lora_request=lora(adapters, 1))[0]
    assert again.num_cached_tokens > 0  # the same adapter reuses its blocks
    assert other.num_cached_tokens == 0
    want = expected(reference, llm, [prompt], [adapters[1]])[0]
    assert other.outputs[0].token_ids == want
    assert first.outputs[0].token_ids == again.outputs[0].token_ids


def test_bad_adapters_are_refused_by_name(llm, adapters, tmp_path, stories_dir):
    dora = make_adapter(stories_dir, tmp_path / "dora", seed=5)
    edit_config(dora, use_dora=True)
    cases = [
        (LoRARequest("missing", 10, str(tmp_path / "nowhere")), "no such folder"),
        (LoRARequest("dora", 11, str(dora)), "use_dora"),
        (LoRARequest("a0-again", 1, str(adapters[1])), "lora_int_id 1 is already"),
    ]
    params = SamplingParams(temperature=0, max_tokens=4)
    for request, words in cases:
        with pytest.raises(ValueError, match=words):
            llm.generate(["Once"], params, use_tqdm=False, lora_request=request)
    ok = greedy(llm, ["Once"], None)  # the engine serves on
    assert ok and ok[0]
    assert_all_blocks_free(llm)


def test_lora_needs_enable_lora(stories_dir, adapters):
    llm = LLM(str(stories_dir), dtype="float32", num_kv_blocks=64)
    with pytest.raises(ValueError, match="--enable-lora"):
        llm.generate(["Once"], SamplingParams(max_tokens=2), use_tqdm=False,
                     lora_request=lora(adapters, 0))


def test_bf16_engines_hold_bf16_adapters_and_a_row_does_not_depend_on_its_batch(
        stories_dir, adapters):
    """--dtype bfloat16: the adapters' weights are bf16 as the base's linears are (half the
    bytes a decode step streams), and a request's greedy output is the same alone and in a
    batch mixing the adapters and the base (lora_sgmv.c's segments, every row's sums in
    the same order)."""
    llm = LLM(str(stories_dir), enable_lora=True, max_loras=4, max_lora_rank=8,
              dtype="bfloat16", num_kv_blocks=256)
    loras = [lora(adapters, i) for i in range(3)] + [None]
    alone = [greedy(llm, [p], r)[0] for p, r in zip(PROMPTS, loras)]
    assert greedy(llm, PROMPTS, loras) == alone
    manager = llm.llm_engine.core.runner.lora
    assert manager.use_kernel
    pairs = [pair for _, weights in manager.adapters.values() for pair in weights.pairs.values()]
    assert pairs and all(p.a.dtype == torch.bfloat16 for p in pairs)
    assert alone[0] != greedy(llm, PROMPTS[:1], None)[0]  # the adapter still changes it
