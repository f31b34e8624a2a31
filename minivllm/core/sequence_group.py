"""Parallel sampling (n > 1, best_of) on the scheduler's side, in one place: the sequences
of one prompt form a SequenceGroup. The first (the head) is the only one queued: it prefills
the prompt but for its last token; then the others (its pending siblings) fork from it,
sharing its blocks (copy-on-write, core/kv_cache.py) and its progress, so that each computes
the last prompt token and samples its own first token. Until they fork, the head keeps a
max_num_seqs seat for each of them.

The scheduler asks a request's group what it needs (holds_back_last_token, ready_to_fork,
num_seats, fork, num_siblings); a request of one sequence is a group of one, for which every
answer is the plain one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minivllm.core.kv_cache import KVCacheManager
    from minivllm.core.request import Request


class SequenceGroup:
    def __init__(self, head: Request) -> None:
        self.sequences: list[Request] = [head]
        self.pending: list[Request] = []  # siblings not forked yet

    @staticmethod
    def form(sequences: list[Request]) -> SequenceGroup:
        """Make the sequences of one prompt one group, the first its head (the one to
        queue); the others fork from it."""
        group = sequences[0].group
        for sibling in sequences[1:]:
            sibling.group = group
            group.sequences.append(sibling)
            group.pending.append(sibling)
        return group

    @property
    def head(self) -> Request:
        return self.sequences[0]

    def __len__(self) -> int:
        return len(self.sequences)

    def _pending_forks(self, request: Request) -> list[Request]:
        return self.pending if request is self.head else []

    def holds_back_last_token(self, request: Request) -> bool:
        """The request stops before its last prompt token: its siblings fork there."""
        return bool(self._pending_forks(request))

    def ready_to_fork(self, request: Request, num_computed_tokens: int) -> bool:
        """With this many tokens computed, the request's siblings fork from it now."""
        return (bool(self._pending_forks(request))
                and num_computed_tokens == request.num_tokens - 1)

    def num_seats(self, request: Request) -> int:
        """Running seats the request takes: its own and those kept for the siblings it will
        fork."""
        return 1 + len(self._pending_forks(request))

    def num_siblings(self, request: Request) -> int:
        """Other unfinished sequences of the group."""
        return sum(1 for r in self.sequences if r is not request and not r.is_finished)

    def fork(self, parent: Request, kv: KVCacheManager, step: int) -> list[Request]:
        """Start the parent's pending siblings at scheduler step `step`: they share its
        blocks and progress. Returns them: the scheduler runs them from now on."""
        children = self._pending_forks(parent)
        if children:
            self.pending = []
        for child in children:
            kv.fork(parent, child)
            child.num_computed_tokens = parent.num_computed_tokens
            child.num_cached_tokens = parent.num_cached_tokens
            child.predicted_output_len = parent.predicted_output_len
            child.last_admitted_step = child.first_scheduled_step = step
        return children

    def finished(self, request: Request) -> None:
        """The request finished: a head that had not forked yet never will."""
        if request is self.head:
            self.pending = []
