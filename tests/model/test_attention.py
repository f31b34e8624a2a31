"""The batched attention path against the per-request reference, on random paged caches."""

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.model.attention import AttentionMetadata, paged_attention, reference_attention
from minivllm.model.kernels import cpu

KERNEL_BUILT = cpu.available(torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("use_kernel", [False, True] if KERNEL_BUILT else [False])
def test_mixed_batch_fast_path_matches_reference(use_kernel):
    """Decodes first (as the runner orders a batch), then prefill chunks with cached context."""
    torch.manual_seed(0)
    block_size, heads, kv_heads, dim = 4, 6, 2, 8
    k_cache = torch.randn(32, block_size, kv_heads, dim)
    v_cache = torch.randn(32, block_size, kv_heads, dim)
    query_lens, seq_lens = [1, 1, 1, 5, 3], [9, 3, 16, 5, 11]
    tables = [[3, 7, 1], [4], [10, 11, 12, 13], [2, 9], [5, 6, 8]]
    width = max(len(t) for t in tables)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(0, dtype=torch.long),
        block_table=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        seq_lens=torch.tensor(seq_lens), query_start_loc=torch.tensor(starts), num_decodes=3,
        num_tokens=sum(query_lens), block_size=block_size, use_kernel=use_kernel)
    q = torch.randn(sum(query_lens), heads, dim)
    expected = reference_attention(q, k_cache, v_cache, meta, 0.3)
    torch.testing.assert_close(paged_attention(q, k_cache, v_cache, meta, 0.3), expected)


def test_engine_greedy_identical_on_reference_and_fast_paths(tiny_llama):
    prompts = [{"prompt_token_ids": [1] + [(i * 13 + n) % 500 + 3 for i in range(n)]}
               for n in (2, 9, 17, 30, 44)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    results = []
    for reference in (True, False):
        llm = LLM(str(tiny_llama), block_size=4, num_kv_blocks=64, max_num_batched_tokens=24)
        llm.llm_engine.runner.use_reference_attention = reference
        results.append([o.outputs[0].token_ids for o in llm.generate(prompts, params,
                                                                     use_tqdm=False)])
    assert results[0] == results[1]
