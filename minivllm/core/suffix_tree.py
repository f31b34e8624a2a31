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


@dataclass
class Proposal:
    token_ids: list[int]
    score: float  # the sum of the tokens' estimated probabilities: expected accepted tokens
    match_len: int  # how many context tokens matched


class SuffixTree:
    """Nodes are ints indexing flat lists, edges one dict of ints: no Python object per node,
    so a tree of a million nodes costs the cyclic garbage collector nothing to scan (with an
    object per node, every full collection walked them all: a quarter second per run of
    the batch benchmark)."""

    ROOT = 0

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        # Node i's count, token, first child and next sibling (-1: none).
        self._count, self._token, self._first, self._next = [0], [-1], [-1], [-1]
        self._edge: dict[int, int] = {}  # parent << 32 | token -> child
        self._free: list[int] = []  # ids of dropped nodes, for reuse
        self._seqs: dict[object, list[int]] = {}
        # Per sequence, the nodes of its suffixes still shorter than max_depth, oldest first.
        self._open: dict[object, list[int]] = {}

    def __len__(self) -> int:
        return len(self._seqs)

    def seq_len(self, seq_id: object) -> int:
        return len(self._seqs.get(seq_id, ()))

    def extend(self, seq_id: object, token_ids: list[int]) -> None:
        """Append tokens to sequence seq_id (a new one starts empty)."""
        seq = self._seqs.setdefault(seq_id, [])
        open_nodes = self._open.setdefault(seq_id, [])
        edge, count = self._edge, self._count
        for token in token_ids:
            seq.append(token)
            # Each open suffix grows by this token; a new one starts at it.
            open_nodes.append(self.ROOT)
            grown = []
            for node in open_nodes:
                child = edge.get(node << 32 | token)
                if child is None:
                    child = self._new_child(node, token)
                count[child] += 1
                grown.append(child)
            # The oldest suffix has reached max_depth tokens: it stops growing.
            if len(seq) >= self.max_depth:
                grown.pop(0)
            open_nodes[:] = grown

    def remove(self, seq_id: object) -> None:
        """Take a sequence's suffixes out of the counts."""
        seq = self._seqs.pop(seq_id)
        del self._open[seq_id]
        for start in range(len(seq)):
            node = self.ROOT
            for token in seq[start:start + self.max_depth]:
                child = self._edge[node << 32 | token]
                self._count[child] -= 1
                if self._count[child] == 0:  # and so is everything under it
                    self._drop(node, child)
                    break
                node = child

    def _new_child(self, parent: int, token: int) -> int:
        if self._free:
            node = self._free.pop()
            self._count[node], self._token[node] = 0, token
            self._first[node], self._next[node] = -1, self._first[parent]
        else:
            node = len(self._count)
            self._count.append(0)
            self._token.append(token)
            self._first.append(-1)
            self._next.append(self._first[parent])
        self._first[parent] = node
        self._edge[parent << 32 | token] = node
        return node

    def _children(self, node: int):
        child = self._first[node]
        while child != -1:
            yield child
            child = self._next[child]

    def _drop(self, parent: int, node: int) -> None:
        """Unlink node from its parent's children and free its subtree."""
        if self._first[parent] == node:
            self._first[parent] = self._next[node]
        else:
            sibling = self._first[parent]
            while self._next[sibling] != node:
                sibling = self._next[sibling]
            self._next[sibling] = self._next[node]
        stack = [(parent, node)]
        while stack:
            parent, node = stack.pop()
            del self._edge[parent << 32 | self._token[node]]
            stack.extend((node, child) for child in self._children(node))
            self._free.append(node)

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
            if node is None or self._first[node] == -1:
                continue
            limit = min(max_tokens, int(length * max_spec_factor + 1e-9))
            proposal = self._follow(node, limit, min_token_prob, length, int(context_included))
            if proposal.score > best.score:
                best = proposal
        return best

    def _find(self, tokens: list[int]) -> int | None:
        node: int | None = self.ROOT
        for token in tokens:
            node = self._edge.get(node << 32 | token)
            if node is None:
                return None
        return node

    def _follow(self, node: int, limit: int, min_token_prob: float, match_len: int,
                uncounted: int) -> Proposal:
        tokens: list[int] = []
        count = self._count
        prob, score, seen = 1.0, 0.0, count[node] - uncounted
        while len(tokens) < limit and self._first[node] != -1:
            # newest children first: a tie goes to the latest continuation, as in ngram
            child = max(self._children(node), key=count.__getitem__)
            prob *= count[child] / seen
            if prob < min_token_prob:
                break
            tokens.append(self._token[child])
            score += prob
            node, seen = child, count[child]
        return Proposal(tokens, score, match_len)
