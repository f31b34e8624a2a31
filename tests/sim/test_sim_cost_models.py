"""Cost models: the roofline's figures from a config.json shape, checked by hand."""

from __future__ import annotations

import json

import pytest

from minivllm.core.step_batch import StepBatch
from minivllm.sim.cost_model_spec import load_cost_model
from minivllm.sim.roofline import GIB, HARDWARE, roofline_from_preset


def test_qwen25_7b_shape():
    cost = roofline_from_preset("rtx4090-qwen2.5-7b")
    shape = cost.shape
    assert shape.num_params == pytest.approx(7.615e9, rel=0.002)  # the model card's 7.61B
    assert shape.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2  # K and V, fp16: 56 KiB
    # (24 GiB x 0.9 - 15.2 GB of weights - 1.5 GiB reserved) / (16 x 56 KiB) blocks
    free = 24 * GIB * 0.9 - shape.num_params * 2 - 1.5 * GIB
    assert cost.num_kv_blocks(16) == int(free // (16 * 57344))
    # about 100k tokens, as docs/lab-cost-models.md says
    assert 90_000 < cost.num_kv_blocks(16) * 16 < 120_000
    assert cost.max_model_len() == 32768


def test_roofline_step_time_by_hand():
    cost = roofline_from_preset("h100-80g")
    hw, s = HARDWARE["h100-80g"], cost.shape
    weights = (s.layer_params + s.head_params) * 2
    # 8 decodes of 1000 tokens of context each: memory-bound
    decode = StepBatch(num_decode_seqs=8, decode_context=8000)
    bytes_moved = weights + s.kv_bytes_per_token * 8000
    assert cost.step_time(decode) == pytest.approx(
        bytes_moved / (hw.memory_bandwidth * hw.bandwidth_efficiency) + hw.step_overhead_s)
    # one 4096-token prefill: compute-bound
    prefill = StepBatch(num_prefill_seqs=1, num_prefill_tokens=4096,
                        prefill_attention=4096 * 4097 // 2)
    flops = (2 * s.layer_params * 4096 + 2 * s.head_params
             + 4 * s.num_layers * s.num_heads * s.head_dim * 4096 * 4097 // 2)
    assert cost.step_time(prefill) == pytest.approx(
        flops / (hw.peak_flops * hw.compute_efficiency) + hw.step_overhead_s)
    swap = StepBatch(num_swap_tokens=1600)
    assert cost.step_time(swap) - cost.step_time(StepBatch()) == pytest.approx(
        1600 * s.kv_bytes_per_token / hw.host_bandwidth)


def test_a_config_json_gives_the_shape(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 5,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8, "vocab_size": 512,
        "max_position_embeddings": 512, "tie_word_embeddings": True}))
    cost = load_cost_model("roofline:a100-80g", str(tmp_path))
    assert cost.shape.num_params == 5 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 172) + 64 * 512
    assert cost.max_model_len() == 512
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ValueError, match="lacks 'num_attention_heads'"):
        load_cost_model("roofline:a100-80g", str(tmp_path))


def test_cpu_preset_uses_the_engines_kv_space():
    cost = roofline_from_preset("cpu")
    assert cost.shape.name == "minivllm-demo"
    assert cost.num_kv_blocks(16) == 4 * GIB // (16 * cost.shape.kv_bytes_per_token)
