"""Mixture-of-experts MLP (Mixtral, Qwen3-MoE): a router picks top-k experts per token,
and each expert runs once per step, as one grouped matmul over the tokens routed to it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.model.models.layers import GatedMLP

# The checkpoint names of one expert's gate, up and down projections, and of the router.
EXPERT_NAMES = {
    "mixtral": ("block_sparse_moe.", "w1", "w3", "w2"),
    "qwen3_moe": ("mlp.", "gate_proj", "up_proj", "down_proj"),
}


class SparseMoeBlock(nn.Module):
    def __init__(self, router: torch.Tensor, experts: list[GatedMLP], top_k: int,
                 norm_topk_prob: bool) -> None:
        super().__init__()
        self.router = router  # [num_experts, hidden]
        self.experts = nn.ModuleList(experts)
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's top-k experts [T, k] and their weights [T, k]: transformers' router,
        op for op (softmax in fp32 over all experts, top-k, optionally renormalized)."""
        probs = torch.softmax(F.linear(x, self.router).float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights /= weights.sum(dim=-1, keepdim=True)
        return experts, weights.to(x.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        experts, weights = self.route(x)
        # The (token, slot) pairs sorted by expert: each expert's tokens are one run.
        order = experts.flatten().argsort(stable=True)
        counts = torch.bincount(experts.flatten(), minlength=len(self.experts)).tolist()
        tokens, slot_weights = order // self.top_k, weights.flatten()[order, None]
        out = torch.zeros_like(x)
        start = 0
        for expert, count in zip(self.experts, counts):  # a loop over experts, not tokens
            if count:
                rows = tokens[start:start + count]
                y = expert(x[rows]) * slot_weights[start:start + count]
                out.index_add_(0, rows, y)
                start += count
        return out if residual is None else residual + out
