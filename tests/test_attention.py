"""The batched attention path against the per-request reference, on random paged caches."""

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.model.attention import AttentionMetadata, paged_attention, reference_attention
from minivllm.model.kernels import cpu

KERNEL_BUILT = cpu.available(torch.device("cpu"), torch.float32)


def _meta(query_lens, seq_lens, tables, block_size, **split):
    tensors = [torch.tensor(t) for t in tables]
    return AttentionMetadata(slot_mapping=torch.zeros(0, dtype=torch.long),
                             query_lens=query_lens, seq_lens=seq_lens, block_tables=tensors,
                             block_size=block_size, **split)


@pytest.mark.parametrize("use_kernel", [False, True] if KERNEL_BUILT else [False])
def test_mixed_batch_fast_path_matches_reference(use_kernel):
    torch.manual_seed(0)
    block_size, heads, kv_heads, dim = 4, 6, 2, 8
    k_cache = torch.randn(32, block_size, kv_heads, dim)
    v_cache = torch.randn(32, block_size, kv_heads, dim)
    query_lens, seq_lens = [1, 5, 1, 3, 1], [9, 5, 3, 11, 16]
    tables = [[3, 7, 1], [2, 9], [4], [5, 6, 8], [10, 11, 12, 13]]
    q = torch.randn(sum(query_lens), heads, dim)
    decodes = [i for i, n in enumerate(query_lens) if n == 1]
    width = max(len(tables[i]) for i in decodes)
    fast = _meta(query_lens, seq_lens, tables, block_size,
                 decode_token_index=torch.tensor([0, 6, 10]),
                 decode_block_table=torch.tensor([tables[i] + [0] * (width - len(tables[i]))
                                                  for i in decodes]),
                 decode_seq_lens=torch.tensor([seq_lens[i] for i in decodes]),
                 prefill_indices=[1, 3], use_kernel=use_kernel)
    expected = reference_attention(q, k_cache, v_cache, fast, 0.3)
    torch.testing.assert_close(paged_attention(q, k_cache, v_cache, fast, 0.3), expected)


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
