"""What the architecture tests in test_model_correctness.py do not show: checkpoints in
shards, the MoE router choosing exactly transformers' experts, config fields we do not
implement failing at load by name, and int8 on the new layer kinds (GeGLU, sandwich norms,
q/k norms, experts)."""

import copy
import json
import shutil

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.model.linear.int8 import Int8Linear
from minivllm.model.loader import load_state_dict
from minivllm.model.models import build_model
from tests.model_factory import _load, hf_greedy_batch


def test_sharded_checkpoint_loads_every_shard(tiny_model_dirs):
    path = tiny_model_dirs["qwen3"]  # saved in shards (model_factory.SHARDED)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not (path / "model.safetensors").exists()
    assert set(load_state_dict(path)) == set(index["weight_map"])


@pytest.mark.parametrize("kind", ["mixtral", "qwen3_moe"])
def test_router_picks_transformers_experts(kind, tiny_model_dirs):
    hf = _load(tiny_model_dirs[kind])
    weights = {k: v.clone() for k, v in load_state_dict(tiny_model_dirs[kind]).items()}
    ours = build_model(copy.deepcopy(hf.config), weights)
    x = torch.randn(257, hf.config.hidden_size, generator=torch.Generator().manual_seed(0))
    hf_gate = hf.model.layers[0].mlp.gate
    with torch.no_grad():
        _, hf_weights, hf_experts = hf_gate(x)
    experts, expert_weights = ours.layers[0].mlp.route(x)
    assert torch.equal(experts, hf_experts)
    torch.testing.assert_close(expert_weights, hf_weights, rtol=0, atol=0)
    # the grouped experts give transformers' MoE output
    with torch.no_grad():
        expected = hf.model.layers[0].mlp(x[None])[0]
    torch.testing.assert_close(ours.layers[0].mlp(x), expected, rtol=1e-5, atol=1e-6)


def _edited(tmp_path, source, **fields):
    shutil.copytree(source, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config.update(fields)
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    return str(tmp_path / "m")


@pytest.mark.parametrize("kind, fields, message", [
    ("llama", {"attn_logit_softcapping": 30.0}, "attn_logit_softcapping=30.0"),
    ("qwen3", {"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0"),
    ("gemma3", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0"),
    ("llama", {"rope_parameters": {"rope_type": "bogus", "rope_theta": 10000.0}},
     "rope_scaling type 'bogus'"),
    ("llama", {"mlp_bias": True}, "mlp_bias=True"),
    ("gemma2", {"hidden_activation": "relu2"}, "hidden_activation='relu2'"),
    ("qwen3", {"layer_types": ["chunked_attention", "full_attention"]}, "layer_types"),
])
def test_unimplemented_config_field_fails_at_load_naming_it(kind, fields, message, tmp_path,
                                                            tiny_model_dirs):
    with pytest.raises(ValueError, match=message):
        LLM(_edited(tmp_path, tiny_model_dirs[kind], **fields), num_kv_blocks=8)


def test_int8_serves_the_new_layer_kinds(tiny_model_dirs):
    """W8A8 is generic over the linears: on Gemma 3 (GeGLU, sandwich and q/k norms) and
    Qwen3-MoE (quantized experts) transformers' fp32 first greedy token stays in the top 5,
    its logprob within 0.2 (measured up to 0.1 on these random weights; fp32: 1e-5)."""
    prompts = [[1] + [(11 * n + 5 * i) % 500 + 3 for i in range(n)] for n in (6, 17, 30, 45)]
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=5)
    for kind in ("gemma3", "qwen3_moe"):
        expected = hf_greedy_batch(tiny_model_dirs[kind], prompts, 1)
        llm = LLM(str(tiny_model_dirs[kind]), quantization="int8", num_kv_blocks=64)
        model = llm.llm_engine.runner.model
        mlp = model.layers[0].mlp
        assert isinstance((mlp.experts[0] if kind == "qwen3_moe" else mlp).down, Int8Linear)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                               use_tqdm=False)
        for output, ([token], [logprob]) in zip(outputs, expected):
            entry = output.outputs[0].logprobs[0]
            assert token in entry, (kind, token, entry)
            assert entry[token].logprob == pytest.approx(logprob, abs=0.2)


def test_checkpoint_tensor_we_do_not_use_fails_at_load(tmp_path, tiny_model_dirs):
    """A part of a model we do not implement (here a Qwen2-MoE-style shared expert) is
    refused by name instead of run without."""
    from safetensors.torch import load_file, save_file

    path = _edited(tmp_path, tiny_model_dirs["llama"])
    state = load_file(f"{path}/model.safetensors")
    state["model.layers.0.mlp.shared_expert.gate_proj.weight"] = torch.zeros(128, 64)
    save_file(state, f"{path}/model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="does not use: model.layers.0.mlp.shared_expert"):
        LLM(path, num_kv_blocks=8)
