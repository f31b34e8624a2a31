"""A depth-limited suffix tree of token sequences, for suffix decoding's proposals.

Every suffix of every sequence added, cut to `max_depth` tokens, is a path from the root;
each node counts the sequences' positions that pass through it, so a node's children say
what followed that context and how often. A sequence grows one token at a time in O(depth)
(the nodes of its last `max_depth` suffixes are kept open and each steps down one child),
and can be removed again (the counts go back down; empty nodes are dropped).

A proposal (SuffixDecoding, Oliaro et al. 2024; vLLM's `suffix` method): for each suffix of
the context (up to max_depth tokens) that occurs with a continuation, follow the most frequent
child while the product of the children's frequencies stays above a floor; the path with the
highest sum of those probabilities (the expected number of accepted tokens) wins.
Plain Python over lists and dicts: core/ imports neither torch nor numpy.
"""

from __future__ import annotations

from dataclasses import dataclass


class _Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


@dataclass
class Proposal:
    token_ids: list[int]
    score: float  # the sum of the tokens' estimated probabilities: expected accepted tokens
    match_len: int  # how many context tokens matched


class SuffixTree:
    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.root = _Node()
        self._seqs: dict[object, list[int]] = {}
        # Per sequence, the nodes of its suffixes still shorter than max_depth, oldest first.
        self._open: dict[object, list[_Node]] = {}

    def __len__(self) -> int:
        return len(self._seqs)

    def seq_len(self, seq_id: object) -> int:
        return len(self._seqs.get(seq_id, ()))

    def extend(self, seq_id: object, token_ids: list[int]) -> None:
        """Append tokens to sequence seq_id (a new one starts empty)."""
        seq = self._seqs.setdefault(seq_id, [])
        open_nodes = self._open.setdefault(seq_id, [])
        depth_limit = self.max_depth
        for token in token_ids:
            seq.append(token)
            # Each open suffix grows by this token; a new one starts at it.
            open_nodes.append(self.root)
            grown = []
            for node in open_nodes:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                child.count += 1
                grown.append(child)
            # The oldest suffix has reached max_depth tokens: it stops growing.
            if len(seq) >= depth_limit:
                grown.pop(0)
            open_nodes[:] = grown

    def remove(self, seq_id: object) -> None:
        """Take a sequence's suffixes out of the counts."""
        seq = self._seqs.pop(seq_id)
        del self._open[seq_id]
        for start in range(len(seq)):
            node = self.root
            for token in seq[start:start + self.max_depth]:
                child = node.children[token]
                child.count -= 1
                if child.count == 0:
                    del node.children[token]  # and everything under it: no other path
                    break
                node = child

    def propose(self, context: list[int], max_tokens: int, min_token_prob: float,
                max_spec_factor: float, context_included: bool = False) -> Proposal:
        """Up to max_tokens tokens likely to follow `context`: of the suffixes of it that
        occur in the tree with a continuation, the one whose proposal scores best (the
        longer on a tie). A long match leaves little depth below it to draft from, a short
        one is a weak signal: at most max_spec_factor tokens per matched token.
        `context_included`: the context ends a sequence of this tree, an occurrence of the
        match with no continuation yet, which does not count against the ones that have."""
        best = Proposal([], 0.0, 0)
        longest = min(self.max_depth - 1, len(context))  # a match needs room for a child
        for length in range(longest, 0, -1):
            node = self._find(context[len(context) - length:])
            if node is None or not node.children:
                continue
            limit = min(max_tokens, int(length * max_spec_factor + 1e-9))
            proposal = self._follow(node, limit, min_token_prob, length, int(context_included))
            if proposal.score > best.score:
                best = proposal
        return best

    def _find(self, tokens: list[int]) -> _Node | None:
        node = self.root
        for token in tokens:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    @staticmethod
    def _follow(node: _Node, limit: int, min_token_prob: float, match_len: int,
                uncounted: int) -> Proposal:
        tokens: list[int] = []
        prob, score, seen = 1.0, 0.0, node.count - uncounted
        while len(tokens) < limit and node.children:
            token, child = max(node.children.items(), key=lambda item: item[1].count)
            prob *= child.count / seen
            if prob < min_token_prob:
                break
            tokens.append(token)
            score += prob
            node, seen = child, child.count
        return Proposal(tokens, score, match_len)
