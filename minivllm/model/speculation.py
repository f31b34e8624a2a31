"""Speculative decoding in the runner: a step's draft tokens — the scheduler's (n-gram,
suffix: SchedulerOutput.scheduled_spec_decode_tokens) or, with --speculative-config's
draft_model method, the draft model's, proposed right before the target's forward — put into
the batch for the target to verify (model/spec_verify.py)."""

from __future__ import annotations

from transformers import AutoConfig

from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.model.draft_model import DraftModel, Forward
from minivllm.model.input_batch import InputBatch
from minivllm.model.loader import resolve_model_path


def draft_model_config(speculative_config: dict | None, hf_config) -> tuple:
    """(path, config) of the draft model of the draft_model method, else (None, None); a
    ValueError when it does not share the target's vocabulary."""
    spec = speculative_config
    if not spec or spec["method"] != "draft_model":
        return None, None
    path = resolve_model_path(spec["model"])
    config = AutoConfig.from_pretrained(path)
    if config.vocab_size != hf_config.vocab_size:
        raise ValueError(f"speculative_config: the draft model {spec['model']!r} has a "
                         f"vocabulary of {config.vocab_size} tokens, the target "
                         f"{hf_config.vocab_size}: they must share the tokenizer")
    return path, config


class Speculation:
    def __init__(self, drafter: DraftModel | None) -> None:
        self.drafter = drafter

    def remove(self, req_id: str) -> None:
        if self.drafter is not None:
            self.drafter.remove(req_id)

    def drafts(self, out: SchedulerOutput, batch: InputBatch,
               forward: Forward) -> dict[str, list[int]]:
        """The step's drafts by request, put after each request's known tokens."""
        drafts = out.scheduled_spec_decode_tokens
        if self.drafter is not None and out.num_scheduled_tokens:
            drafts = self.drafter.propose(out, batch, forward)
        for req_id, tokens in drafts.items():
            batch.requests[req_id].put_drafts(tokens)
        return drafts
