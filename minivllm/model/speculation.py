"""Speculative decoding in the runner: a step's draft tokens — the scheduler's (n-gram,
suffix: SchedulerOutput.scheduled_spec_decode_tokens) or, with --speculative-config's
draft_model method, the draft model's, proposed right before the target's forward — put into
the batch for the target to verify (model/spec_verify.py)."""

from __future__ import annotations

import torch
from transformers import AutoConfig

from minivllm.core.draft_proposers import DRAFT_PLACEHOLDER
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.model.draft_model import DraftModel, Forward
from minivllm.model.input_batch import InputBatch
from minivllm.model.loader import resolve_model_path
from minivllm.model.sampler import Sampler, inverse_cdf
from minivllm.model.spec_verify import DRAFT_STREAM


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
        # request id -> the distributions [k, V] its drafts were drawn from this step
        # (a draft model's, for a request that samples: model/spec_verify.py)
        self.proposals: dict[str, torch.Tensor] = {}

    def remove(self, req_id: str) -> None:
        if self.drafter is not None:
            self.drafter.remove(req_id)

    def drafts(self, out: SchedulerOutput, batch: InputBatch, forward: Forward,
               sampler: Sampler) -> dict[str, list[int]]:
        """The step's drafts by request, put after each request's known tokens: the
        scheduler's, the draft model's where it left placeholders."""
        drafts = dict(out.scheduled_spec_decode_tokens)
        wanted = {r: len(d) for r, d in drafts.items() if d[0] == DRAFT_PLACEHOLDER}
        self.proposals = {}
        if self.drafter is not None and wanted and out.num_scheduled_tokens:
            by_model, self.proposals = self.drafter.propose(
                wanted, batch, forward, lambda ids, logits, j: _choose(sampler, ids, logits, j))
            drafts.update(by_model)
        for req_id, tokens in drafts.items():
            batch.requests[req_id].put_drafts(tokens)
        return drafts

    def verified(self, req_id: str, num_computed: int) -> None:
        """The request's tokens the target computed, its accepted drafts among them."""
        if self.drafter is not None:
            self.drafter.verified(req_id, num_computed)


def _choose(sampler: Sampler, req_ids: list[str], logits: torch.Tensor,
            ahead: int) -> tuple[list[int], list[torch.Tensor | None]]:
    """The draft model's token for each request at its draft `ahead`: a greedy request's
    argmax; a sampled one's drawn from the draft's distribution under the request's
    temperature and filters (not its penalties or grammar: the draft has no state of its
    own), with the request's draft stream of random numbers, and that distribution kept."""
    tokens = logits.argmax(dim=-1).tolist()
    distributions: list[torch.Tensor | None] = [None] * len(req_ids)
    sampled = [i for i, r in enumerate(req_ids) if not sampler.is_greedy(r)]
    if sampled:
        ids = [req_ids[i] for i in sampled]
        index = torch.tensor(sampled, device=logits.device)
        q = sampler.probabilities(logits[index].float(), ids, own_state=False).cpu()
        drawn = inverse_cdf(q, sampler.uniforms(ids, DRAFT_STREAM, ahead)).tolist()
        for n, i in enumerate(sampled):
            tokens[i], distributions[i] = drawn[n], q[n]
    return tokens, distributions
