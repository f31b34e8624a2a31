"""Suffix decoding (core/suffix_tree.py, core/draft_proposers.SuffixProposer): the tree's
counts as sequences grow and are removed, proposals from the longest match along the most
frequent children, and the proposer's two trees: the request's own tokens and recent
requests' outputs, bounded."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.core.draft_proposers import SuffixProposer
from minivllm.core.request import Request
from minivllm.core.speculative import SpeculativeConfig
from minivllm.core.suffix_tree import SuffixTree


def counts(tree: SuffixTree) -> dict[tuple[int, ...], int]:
    """Every path's count, by its tokens."""
    out, stack = {}, [((), tree.ROOT)]
    while stack:
        path, node = stack.pop()
        for child in tree._children(node):
            key = path + (tree._token[child],)
            out[key] = tree._count[child]
            stack.append((key, child))
    return out


def brute_force(seqs: list[list[int]], depth: int) -> dict[tuple[int, ...], int]:
    out: dict[tuple[int, ...], int] = {}
    for seq in seqs:
        for start in range(len(seq)):
            for end in range(start + 1, min(len(seq), start + depth) + 1):
                key = tuple(seq[start:end])
                out[key] = out.get(key, 0) + 1
    return out


@settings(max_examples=60, deadline=None)
@given(seqs=st.lists(st.lists(st.integers(0, 3), max_size=12), min_size=1, max_size=4),
       depth=st.integers(2, 5), chunk=st.integers(1, 4), removed=st.sets(st.integers(0, 3)))
def test_counts_are_every_suffix_cut_to_depth_as_sequences_grow_and_go(seqs, depth, chunk,
                                                                       removed):
    tree = SuffixTree(depth)
    for i, seq in enumerate(seqs):  # grown a few tokens at a time
        for at in range(0, len(seq), chunk):
            tree.extend(i, seq[at:at + chunk])
        if not seq:
            tree.extend(i, [])
    assert counts(tree) == brute_force(seqs, depth)
    for i in removed & set(range(len(seqs))):
        tree.remove(i)
    assert counts(tree) == brute_force(
        [seq for i, seq in enumerate(seqs) if i not in removed], depth)


def test_proposal_follows_the_most_frequent_children_of_the_best_scored_match():
    tree = SuffixTree(8)
    tree.extend("a", [1, 2, 3, 4, 5, 1, 2, 3, 4, 6, 1, 2, 3, 4, 5, 9, 1, 2])
    # (1, 2) occurs 4 times, 3 of them followed by 3 4, then 5 twice and 6 once, then 1 or 9
    # (a tie: the later one, 9): the path's probabilities 3/4, 3/4, 3/4 * 2/3 = 1/2, 1/4, ...
    proposal = tree.propose([7, 1, 2], 5, 0.1, 4.0)
    assert proposal.token_ids == [3, 4, 5, 9, 1]
    assert proposal.match_len == 2 and proposal.score == 0.75 + 0.75 + 0.5 + 0.25 + 0.25
    assert tree.propose([7, 1, 2], 5, 0.3, 4.0).token_ids == [3, 4, 5]  # 1/4 < 0.3 stops
    # the tree's own last (1, 2) has no continuation yet: it does not count against 3
    own = tree.propose([7, 1, 2], 5, 0.1, 4.0, context_included=True)
    assert own.token_ids == [3, 4, 5, 9, 1] and own.score == 1 + 1 + 2 / 3 + 1 / 3 + 1 / 3
    assert tree.propose([7, 1, 2], 5, 0.6, 4.0).token_ids == [3, 4]
    assert tree.propose([7, 1, 2], 5, 0.1, 1.0).token_ids == [3, 4]  # 1 token per match
    # (9, 1, 2) ends the sequence: no continuation, so (1, 2) answers (and (2) would score
    # the same: the longer match wins the tie)
    assert tree.propose([9, 1, 2], 5, 0.1, 4.0).match_len == 2
    # (5, 1, 2) was seen once, followed by 3 4 6 1 2: five certain steps; (4, 5, 1, 2) too,
    # but it leaves only 4 levels of the depth-8 tree below it
    longer = tree.propose([4, 5, 1, 2], 5, 0.1, 4.0)
    assert longer.match_len == 3 and longer.token_ids == [3, 4, 6, 1, 2]
    assert longer.score == 5.0
    # a long match leaves little depth below it: a shorter one drafts further
    deep = SuffixTree(4)
    deep.extend("a", [1, 2, 3, 4, 5, 6, 1, 2, 3])
    assert deep.propose([1, 2, 3], 5, 0.1, 4.0).token_ids == [4, 5, 6]  # from (3), not (1 2 3)
    assert tree.propose([8, 8], 5, 0.0, 4.0).token_ids == []  # no match


def request(request_id: str, prompt: list[int], outputs: list[int] = ()) -> Request:
    r = Request.make(request_id, prompt, max_tokens=64)
    for token in outputs:
        r.append_output_token(token)
    return r


def test_the_proposer_reads_the_request_and_recent_requests_outputs_bounded():
    config = SpeculativeConfig(method="suffix", suffix_decoding_max_spec_factor=4.0,
                               suffix_decoding_max_cached_requests=2)
    proposer = SuffixProposer(config)
    # its own prompt: "10 11 12 13" comes back
    assert proposer(request("a", [10, 11, 12, 13, 50, 10, 11]), 3) == [12, 13, 50]
    # a finished request's output helps another request with another prompt
    proposer.finish(request("b", [1], [20, 21, 22, 23, 24]))
    assert proposer(request("c", [5, 20, 21]), 3) == [22, 23, 24]
    assert "a" in proposer.local and "c" in proposer.local
    proposer.finish(request("a", [10]))
    assert "a" not in proposer.local
    for i in range(3):  # more than max_cached_requests: the oldest go
        proposer.finish(request(f"d{i}", [1], [70 + i, 80 + i, 90 + i]))
    assert len(proposer.cache) == 2
    assert proposer(request("e", [20, 21]), 3) == []
    assert proposer(request("f", [72, 80 + 2]), 3) == [92]
