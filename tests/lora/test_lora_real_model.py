"""LoRA on a real trained model: four random-weight adapters made by peft on
SmolLM2-135M-Instruct; greedy output through minivllm equals transformers + peft on the same
adapter, each alone and in one batch mixing the four and the base model.

`make test-real-models`."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.lora import LoRARequest
from tests.conftest import assert_all_blocks_free
from tests.lora_utils import PeftReference, make_adapter

pytestmark = pytest.mark.real_model

PROMPTS = ["The capital of France is", "Once upon a time, there was a"]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def hf_dir(smollm2_gguf, tmp_path_factory):
    """The GGUF file dequantized by transformers and saved as a safetensors folder: what
    peft builds adapters on, and what both engines load (the same weights)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("smollm2-hf")
    kwargs = dict(gguf_file=smollm2_gguf.name)
    model = AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, dtype=torch.float32,
                                                 **kwargs)
    # transformers refuses to save a model it loaded from GGUF: the tensors, by hand (the
    # LM head is the tied embeddings).
    save_file({k: v.contiguous() for k, v in model.state_dict().items()
               if k != "lm_head.weight"}, out / "model.safetensors", metadata={"format": "pt"})
    model.config.architectures = ["LlamaForCausalLM"]  # not set by the GGUF loader
    model.config.save_pretrained(out)
    AutoTokenizer.from_pretrained(smollm2_gguf.parent, **kwargs).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def adapters(hf_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("smollm2-adapters")
    return [make_adapter(hf_dir, root / f"a{i}", seed=i, rank=8 * (1 + i % 2))
            for i in range(4)]


@pytest.fixture(scope="module")
def llm(hf_dir):
    return LLM(str(hf_dir), enable_lora=True, max_loras=4, dtype="float32",
               num_kv_blocks=512)


@pytest.mark.timeout(900)  # transformers + peft generate the references one by one
def test_adapters_alone_and_mixed_equal_peft(llm, adapters, hf_dir):
    reference = PeftReference(hf_dir)
    tok = llm.get_tokenizer()
    loras = [LoRARequest(f"a{i}", i + 1, str(a)) for i, a in enumerate(adapters)]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)

    def run(prompts, picks):
        outs = llm.generate(prompts, params, use_tqdm=False,
                            lora_request=[None if i is None else loras[i] for i in picks])
        return [o.outputs[0].token_ids for o in outs]

    want = {(p, i): reference.generate(None if i is None else adapters[i], tok(p).input_ids,
                                       MAX_TOKENS)
            for p in PROMPTS for i in (None, 0, 1, 2, 3)}
    for i in range(4):  # alone
        assert run(PROMPTS, [i] * len(PROMPTS)) == [want[(p, i)] for p in PROMPTS], i
        assert [want[(p, i)] for p in PROMPTS] != [want[(p, None)] for p in PROMPTS]
    picks = [0, 1, 2, 3, None] * 2  # mixed: every prompt with every adapter and the base
    prompts = [PROMPTS[k % 2] for k in range(10)]
    assert run(prompts, picks) == [want[(p, i)] for p, i in zip(prompts, picks)]
    assert_all_blocks_free(llm)
