"""Random-weight LoRA adapters made with peft (PEFT's own files), and the reference output
of transformers + peft on them."""

from __future__ import annotations

import json
from pathlib import Path

import torch

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_adapter(model_dir: Path, out: Path, seed: int, rank: int = 8,
                 targets: tuple[str, ...] = ALL_TARGETS, b_std: float = 0.02,
                 **config) -> Path:
    """A LoRA adapter of `model_dir` with random A and B (B of std b_std: a clear change of
    the output, not noise), saved by peft in its format."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank,
                                                  target_modules=list(targets), **config))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, b_std)
    peft_model.save_pretrained(out)
    return out


def edit_config(adapter: Path, **changes) -> None:
    path = adapter / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


class PeftReference:
    """Greedy generation by transformers with each adapter (None: the base model)."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.peft = None

    def generate(self, adapter: Path | None, prompt_ids: list[int], max_tokens: int) -> list[int]:
        from peft import PeftModel

        name = str(adapter)
        if adapter is not None:
            if self.peft is None:
                self.peft = PeftModel.from_pretrained(self.model, adapter, adapter_name=name)
            elif name not in self.peft.peft_config:
                self.peft.load_adapter(adapter, adapter_name=name)
        ids = torch.tensor([prompt_ids])
        kwargs = dict(max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
        with torch.no_grad():
            if adapter is not None:
                self.peft.set_adapter(name)
                out = self.peft.generate(ids, **kwargs)
            elif self.peft is not None:
                with self.peft.disable_adapter():
                    out = self.peft.generate(ids, **kwargs)
            else:
                out = self.model.generate(ids, **kwargs)
        return out[0, len(prompt_ids):].tolist()
