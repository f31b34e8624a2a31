"""Parallel sampling (n > 1, best_of) on the scheduler's side, in one place: the sequences
of one prompt form a SequenceGroup (form_group). The first (the head) is the only one queued:
it prefills the prompt but for its last token; then the others (its pending siblings) fork
from it, sharing its blocks (copy-on-write, core/kv_cache.py) and its progress, so that each
computes the last prompt token and samples its own first token. Until they fork, the head
keeps a max_num_seqs seat for each of them.

The scheduler and the policies ask these functions about a request; a request of one
sequence has no group (Request.group None), and every answer is then the plain one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minivllm.core.request import Request

if TYPE_CHECKING:
    from minivllm.core.kv_cache import KVCacheManager


class SequenceGroup:
    def __init__(self, sequences: list[Request]) -> None:
        self.sequences = sequences  # the head first
        self.pending: list[Request] = []  # the head's siblings not forked yet


def form_group(sequences: list[Request]) -> Request:
    """Make the sequences of one prompt one group; return its head, the one to queue (the
    others fork from it)."""
    group = SequenceGroup(sequences)
    group.pending = sequences[1:]
    for request in sequences:
        request.group = group
    return sequences[0]


def group_size(request: Request) -> int:
    return 1 if request.group is None else len(request.group.sequences)


def is_head(request: Request) -> bool:
    """The sequence that prefills the group's prompt (a request alone is its own head)."""
    return request.group is None or request.group.sequences[0] is request


def _pending_forks(request: Request) -> list[Request]:
    group = request.group
    return group.pending if group is not None and group.sequences[0] is request else []


def holds_back_last_token(request: Request) -> bool:
    """The request stops before its last prompt token: its siblings fork there."""
    return bool(_pending_forks(request))


def ready_to_fork(request: Request, num_computed_tokens: int) -> bool:
    """With this many tokens computed, the request's siblings fork from it now."""
    return bool(_pending_forks(request)) and num_computed_tokens == request.num_tokens - 1


def num_seats(request: Request) -> int:
    """Running seats the request takes: its own and those kept for the siblings it will fork."""
    return 1 + len(_pending_forks(request))


def num_siblings(request: Request) -> int:
    """Other unfinished sequences of its group."""
    if request.group is None:
        return 0
    return sum(1 for r in request.group.sequences if r is not request and not r.is_finished)


def fork(parent: Request, kv: KVCacheManager, step: int) -> list[Request]:
    """Start the parent's pending siblings at scheduler step `step`: they share its blocks
    and progress. Returns them: the scheduler runs them from now on."""
    children = _pending_forks(parent)
    if children:
        parent.group.pending = []
    for child in children:
        kv.fork(parent, child)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        child.predicted_output_len = parent.predicted_output_len
        child.last_admitted_step = child.first_scheduled_step = step
    return children


def finished(request: Request) -> None:
    """The request finished: a head that had not forked yet never will."""
    if _pending_forks(request):
        request.group.pending = []
