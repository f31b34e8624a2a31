"""--kv-cache-dtype int8 / fp8 / fp8_e4m3 / fp8_e5m2 (model/kv_quant.py): the C kernels
reading a quantized cache against the torch reference on the same cache, the fused K/V
write against kv_quant.quantize byte for byte, the scales travelling with the blocks through
copies and swaps, the capacity, and the engine against the fp32-cache engine."""

import pytest
import torch
from transformers import AutoConfig

from minivllm import LLM, SamplingParams
from minivllm.config import EngineConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.model.attention import _one_request, padded_decode_attention, write_kv
from minivllm.model.kernels import attention_ops
from minivllm.model.kv_quant import FORMATS, QuantizedKV, quantize
from minivllm.model.runner import ModelRunner
from tests.kernel_marks import needs_kernels
from tests.model.test_prefill_kernel import _batch

NAMES = ["int8", "fp8_e4m3", "fp8_e5m2"]


def _quantized(cache: torch.Tensor, name: str) -> QuantizedKV:
    fmt = FORMATS[name]
    return QuantizedKV(*quantize(cache, fmt), fmt)


@pytest.mark.parametrize("name, bound", [("int8", 0.5 / 127), ("fp8_e4m3", 2 ** -4),
                                         ("fp8_e5m2", 2 ** -3)])
def test_quantize_round_trip_within_half_a_step(name, bound):
    """Each value comes back within half a quantization step: 1/254 of its head's absmax for
    int8, half an ulp (2^-4 / 2^-3 relative) for fp8; a zero head stays zero."""
    x = torch.randn(50, 3, 24) * torch.logspace(-3, 3, 50)[:, None, None]
    x[7, 1] = 0
    cache = _quantized(x, name)
    back = cache.dequantized(torch.float32)
    absmax = x.abs().amax(-1, keepdim=True)
    limit = bound * (absmax if name == "int8" else x.abs()) + 1e-6 * absmax
    assert (back - x).abs().le(limit).all()
    assert torch.equal(back[7, 1], torch.zeros(24)) and cache.scales[7, 1] == 0


@needs_kernels
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("heads, kv_heads, dim, block_size, window, softcap", [
    (6, 2, 64, 4, 0, 0.0), (9, 3, 64, 16, 0, 0.0), (4, 4, 24, 16, 0, 0.0),
    (10, 2, 80, 16, 0, 0.0), (8, 2, 128, 5, 7, 0.0), (6, 3, 16, 3, 0, 30.0)])
def test_decode_kernel_reads_quantized_cache(name, heads, kv_heads, dim, block_size, window,
                                             softcap):
    """The kernel (per-element dequantization, or scales folded into scores and
    probabilities) against the torch path's dequantized cache: equal up to summation order."""
    q, k_cache, v_cache, _, table, _, seq_lens = _batch(
        [1] * 6, [0, 3, 9, 16, 30, 70], heads, kv_heads, dim, block_size, seed=1)
    k, v = _quantized(k_cache, name), _quantized(v_cache * 5, name)
    scale = dim ** -0.5
    got = attention_ops.paged_decode_attention(q, k, v, table, seq_lens, scale, window, softcap)
    expected = padded_decode_attention(q, k, v, table, seq_lens, block_size, scale, window,
                                       softcap)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # and against the fp32 cache: moved by quantization (so the above can fail), a little
    # (measured: int8 0.4-0.8% of the largest output, fp8_e4m3 2-4%, fp8_e5m2 7-8%)
    exact = padded_decode_attention(q, k_cache, v_cache * 5, table, seq_lens, block_size,
                                    scale, window, softcap)
    moved = ((got - exact).abs().max() / exact.abs().max()).item()
    assert 0 < moved < {"int8": 0.015, "fp8_e4m3": 0.06, "fp8_e5m2": 0.12}[name]


@needs_kernels
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("heads, kv_heads, dim, block_size, window", [
    (6, 2, 32, 8, 0), (9, 3, 64, 16, 0), (5, 1, 40, 3, 0), (4, 2, 24, 7, 10)])
def test_prefill_kernel_reads_quantized_cache(name, heads, kv_heads, dim, block_size, window):
    q, k_cache, v_cache, tables, table, qsl, seq_lens = _batch(
        [5, 17, 1, 40], [0, 7, 12, 3], heads, kv_heads, dim, block_size, seed=2)
    k, v = _quantized(k_cache, name), _quantized(v_cache, name)
    got = attention_ops.paged_prefill_attention(q, k, v, table, qsl, seq_lens, 0.2, window)
    for i, blocks in enumerate(tables):
        start, end = qsl[i].item(), qsl[i + 1].item()
        expected = _one_request(q[start:end], k, v, blocks, seq_lens[i].item(), 0.2, window)
        torch.testing.assert_close(got[start:end], expected, rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("name", NAMES)
def test_fused_kv_write_quantizes_as_torch(name):
    """rope_write_kv stores the bytes and scales torch's write_kv (kv_quant.quantize)
    stores, at every slot, and leaves the other slots alone."""
    tokens, heads, kv_heads, dim = 9, 4, 2, 40
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim) * torch.logspace(-2, 2, tokens)[:, None]
    qkv[3, heads * dim:(heads + 1) * dim] = 0  # a zero head: scale 0
    positions = torch.arange(tokens)
    cos, sin = torch.ones(tokens, dim), torch.zeros(tokens, dim)  # rotation by 0
    slots = torch.tensor([5, 0, 9, 3, 11, 2, 7, 13, 1])
    fmt = FORMATS[name]

    def empty():
        return QuantizedKV(torch.zeros(16, 1, kv_heads, dim, dtype=fmt.storage),
                           torch.full((16, 1, kv_heads), -1.0), fmt)
    fused, torch_written = (empty(), empty()), (empty(), empty())
    k = qkv[:, heads * dim:(heads + kv_heads) * dim].reshape(tokens, kv_heads, dim).clone()
    v = qkv[:, (heads + kv_heads) * dim:].reshape(tokens, kv_heads, dim).clone()
    attention_ops.rope_write_kv(qkv, positions, (cos, sin), slots, *fused, heads, kv_heads, dim)
    write_kv(*torch_written, k, v, slots)
    for got, expected in zip(fused, torch_written):
        assert torch.equal(got.data, expected.data)
        assert torch.equal(got.scales, expected.scales)
    assert fused[0].scales[3, 0, 0] == 0 and fused[0].scales[4, 0, 0] == -1  # 4: untouched


def test_kv_cache_dtype_names_and_the_error():
    for name in ("int8", "fp8", "fp8_e4m3", "fp8_e5m2", "bf16", "auto"):
        assert EngineConfig(kv_cache_dtype=name).kv_cache_dtype == name
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, bfloat16, bf16, "
                                         "int8, fp8, fp8_e4m3, fp8_e5m2"):
        EngineConfig(kv_cache_dtype="int4")


def _runner(model, **kwargs) -> ModelRunner:
    config = EngineConfig(model=str(model), **kwargs)
    return ModelRunner(config, model, AutoConfig.from_pretrained(model), 64)


def test_a_quantized_block_costs_a_byte_a_value_and_its_scales(tiny_model_dirs):
    """head_dim + 4 bytes per token and KV head against bf16's 2 * head_dim: 2 D / (D + 4)
    times bf16's blocks in the same space (1.78x at head_dim 32; SmolLM2's 64: 1.88x)."""
    model = tiny_model_dirs["llama3-rope"]  # head_dim 32, 2 layers, 2 KV heads
    runners = {kv: _runner(model, kv_cache_dtype=kv, kv_cache_space=0.01, swap_space=0.001)
               for kv in ("bfloat16", "int8", "fp8")}
    per_block = 2 * 2 * 16 * 2  # K and V, layers, block_size, KV heads
    assert runners["bfloat16"].block_bytes == per_block * 32 * 2
    assert runners["int8"].block_bytes == runners["fp8"].block_bytes == per_block * (32 + 4)
    blocks = {kv: r.num_blocks for kv, r in runners.items()}
    assert blocks["int8"] == blocks["fp8"] == int(0.01 * (1 << 30) // (per_block * 36))
    assert abs(blocks["int8"] / blocks["bfloat16"] - 64 / 36) < 1e-3
    assert runners["int8"].k_cache.data.dtype == torch.int8
    assert runners["fp8"].kv_dtype == torch.float8_e4m3fn


def _fill(cache: QuantizedKV, base: float) -> None:
    """Block b's bytes hold b % 100 and its scales base + b."""
    for block in range(cache.shape[1]):
        cache.data[:, block] = block % 100
        cache.scales[:, block] = base + block


def _held(cache: QuantizedKV, block: int) -> tuple[int, float]:
    data, scales = torch.unique(cache.data[:, block]), torch.unique(cache.scales[:, block])
    assert len(data) == len(scales) == 1
    return data.item(), scales.item()


@pytest.mark.parametrize("name", ["int8", "fp8_e5m2"])
def test_copies_and_swaps_carry_the_scales(tiny_llama, name):
    """copy_blocks moves each block's scales with its bytes: copy-on-write copies, swap-outs
    to the host pool and swap-ins back."""
    runner = _runner(tiny_llama, kv_cache_dtype=name, num_kv_blocks=8, swap_space=0.001)
    caches = (runner.k_cache, runner.v_cache, runner.k_host, runner.v_host)
    for cache, base in zip(caches, (1000, 2000, 3000, 4000)):
        _fill(cache, base)
    runner.copy_blocks(SchedulerOutput(step=1, swap_out=[(2, 0)], copies=[(3, 5)],
                                       swap_in=[(1, 6)]))
    assert _held(runner.k_host, 0) == (2, 1002) and _held(runner.v_host, 0) == (2, 2002)
    assert _held(runner.k_cache, 5) == (3, 1003) and _held(runner.v_cache, 5) == (3, 2003)
    assert _held(runner.k_cache, 6) == (1, 3001) and _held(runner.v_cache, 6) == (1, 4001)
    assert _held(runner.k_cache, 4) == (4, 1004)  # untouched


def _score(llm, sequences) -> list[list[float]]:
    scored = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": s} for s in sequences], scored, use_tqdm=False)
    return [[e[t].logprob for e, t in zip(o.prompt_logprobs[1:], o.prompt_token_ids[1:])]
            for o in outs]


@pytest.mark.parametrize("name, tolerance", [("int8", 0.03), ("fp8", 0.15),
                                             ("fp8_e5m2", 0.3)])
def test_engine_quantized_cache_against_fp32_cache(tiny_llama, name, tolerance):
    """8 prompts x 24 greedy tokens, scored teacher-forced by both engines on the fp32-cache
    engine's continuations: the mean |dlogprob| stays small, and is not 0 (the cache is
    quantized). Measured on this model (head_dim 16, sharp random weights), C kernels and
    torch reference alike: int8 0.016, fp8_e4m3 0.083, fp8_e5m2 0.18 (bf16: 0.006)."""
    prompts = [[1] + [(7 * i + 13 * j) % 90 + 5 for j in range(3 + i % 5)] for i in range(8)]
    kwargs = dict(seed=0, dtype="float32", num_kv_blocks=128, block_size=4)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    fp32 = LLM(str(tiny_llama), **kwargs)
    tokens = [o.outputs[0].token_ids for o in fp32.generate(
        [{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)]
    sequences = [p + t for p, t in zip(prompts, tokens)]
    base = _score(fp32, sequences)
    quantized = LLM(str(tiny_llama), kv_cache_dtype=name, **kwargs)
    assert isinstance(quantized.llm_engine.runner.k_cache, QuantizedKV)
    scores = _score(quantized, sequences)
    deltas = [abs(a - b) for s, r in zip(scores, base) for a, b in zip(s, r)]
    assert 0 < sum(deltas) / len(deltas) < tolerance


def test_quantized_cache_through_swaps_and_the_prefix_cache(stories_dir):
    """On real weights, an int8 cache gives the same greedy tokens when requests are
    preempted by swapping (their blocks and scales out to the host and back) and when
    prompts share cached prefix blocks, as with room and no sharing."""
    prefix = [1] + [(11 * j) % 400 + 30 for j in range(13)]
    prompts = [prefix + [(5 * i + j) % 300 + 40 for j in range(2 + i)] for i in range(4)]
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)

    def generate(llm):
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy,
                               use_tqdm=False)
        return [o.outputs[0].token_ids for o in outputs]

    def engine(**kwargs):
        return LLM(str(stories_dir), kv_cache_dtype="int8", block_size=4, swap_space=0.01,
                   **kwargs)

    reference = generate(engine(num_kv_blocks=128, enable_prefix_caching=False))
    swapped = engine(num_kv_blocks=12, preemption_mode="swap", enable_prefix_caching=False)
    assert generate(swapped) == reference and swapped.stats().num_preemptions > 0
    cached = engine(num_kv_blocks=128, enable_prefix_caching=True)
    assert generate(cached) == reference
    assert generate(cached) == reference  # now from the cached blocks
    assert cached.stats().prefix_cache_hits > 0


def test_a_draft_model_caches_in_the_same_format(stories_dir):
    """draft_model speculation with the target as its own draft on an int8 cache: the draft
    model's cache is quantized too, the output is the int8 engine's without speculation, and
    every greedy draft is accepted (the draft's K/V are the target's, byte for byte)."""
    spec = {"method": "draft_model", "num_speculative_tokens": 3, "model": str(stories_dir),
            "disable_by_batch_size": None, "adaptive_draft_length": False}
    prompts = [{"prompt_token_ids": [1] + [(9 * i + 4 * j) % 300 + 50 for j in range(5 + i)]}
               for i in range(3)]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs = {}
    for speculative_config in (None, spec):
        llm = LLM(str(stories_dir), kv_cache_dtype="int8", block_size=4,
                  speculative_config=speculative_config)
        outputs[bool(speculative_config)] = [
            o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    assert isinstance(llm.llm_engine.runner.drafter.caches[0], QuantizedKV)
    assert outputs[True] == outputs[False]
    stats = llm.stats()
    assert stats.spec_num_accepted_tokens == stats.spec_num_draft_tokens > 0


@needs_kernels
@pytest.mark.parametrize("kind", ["gemma2", "mistral", "phi4-mini"])
def test_kernels_and_the_reference_agree_on_a_quantized_cache(tiny_model_dirs, kind):
    """Sliding windows, logit caps, a partial rotary embedding (phi4-mini: the torch write
    path): through the engine, the C kernels and the per-request torch reference score the
    same sequences on an int8 cache alike. Not to float32 rounding, as with an fp32 cache:
    an ulp of difference in one layer's output can move a value of the next layer's K/V
    across an int8 rounding boundary (measured on mistral: one V byte of ~1,500, 0.0029 on
    one logprob, mean 8e-5, against int8's own 0.017 from the fp32 cache)."""
    prompts = [[1] + [(5 * i + 3 * j) % 90 + 5 for j in range(20 + 3 * i)] for i in range(4)]
    scores = {}
    for reference in (False, True):
        llm = LLM(str(tiny_model_dirs[kind]), kv_cache_dtype="int8", num_kv_blocks=64,
                  block_size=4, seed=0)
        llm.llm_engine.runner.use_reference_attention = reference
        scores[reference] = [x for row in _score(llm, prompts) for x in row]
    deltas = [abs(a - b) for a, b in zip(scores[False], scores[True])]
    assert sum(deltas) / len(deltas) < 1e-3 and max(deltas) < 0.01
