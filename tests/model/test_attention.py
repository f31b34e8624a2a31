"""The batched attention path against the per-request reference, on random paged caches."""

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.model.attention import AttentionMetadata, paged_attention, reference_attention
from minivllm.model.kernels import library

KERNEL_BUILT = library.available(torch.device("cpu"), torch.float32)


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


@pytest.mark.parametrize("use_kernel", [False, True] if KERNEL_BUILT else [False])
def test_rows_verifying_drafts_attend_as_one_token_decodes_bit_for_bit(use_kernel):
    """A decode, a request verifying 3 drafts (4 rows, 11 tokens after the step) and a
    prefill chunk: each verification row gets exactly what a one-token decode at its
    position gets (what makes the verified tokens a decode's: model/spec_verify.py)."""
    torch.manual_seed(0)
    block_size, heads, kv_heads, dim = 4, 6, 2, 8
    k_cache = torch.randn(32, block_size, kv_heads, dim)
    v_cache = torch.randn(32, block_size, kv_heads, dim)
    tables = torch.tensor([[3, 7, 0], [4, 9, 12], [10, 11, 0]])

    def meta(table, query_lens, seq_lens, num_decodes, num_verifies=0):
        starts = torch.tensor([0] + query_lens).cumsum(0)
        return AttentionMetadata(
            slot_mapping=torch.zeros(0, dtype=torch.long), block_table=table,
            seq_lens=torch.tensor(seq_lens), query_start_loc=starts, num_decodes=num_decodes,
            num_tokens=sum(query_lens), block_size=block_size, use_kernel=use_kernel,
            num_verifies=num_verifies)

    q = torch.randn(8, heads, dim)
    step = meta(tables, [1, 4, 3], [6, 11, 7], num_decodes=1, num_verifies=1)
    out = paged_attention(q, k_cache, v_cache, step, 0.3)
    torch.testing.assert_close(out, reference_attention(q, k_cache, v_cache, step, 0.3))
    for j in range(4):
        alone = meta(tables[1:2], [1], [8 + j], num_decodes=1)
        assert torch.equal(out[1 + j], paged_attention(q[1 + j:2 + j], k_cache, v_cache,
                                                       alone, 0.3)[0])


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
