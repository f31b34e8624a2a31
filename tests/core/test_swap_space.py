"""SwapSpace on its own: host blocks handed out lowest id first, and given back."""

from __future__ import annotations

from minivllm.core.swap_space import SwapSpace


def test_host_blocks_are_handed_out_in_order_and_given_back():
    swap = SwapSpace(4)
    assert swap.can_hold(4) and not swap.can_hold(5)
    taken = swap.take(3)
    assert taken == [0, 1, 2] and swap.free_blocks == [3] and not swap.can_hold(2)
    swap.give_back(taken)
    assert swap.take(2) == [0, 1]  # what was given back is handed out first, in its order
    assert sorted(swap.free_blocks) == [2, 3]


def test_an_empty_swap_space_holds_nothing_but_an_empty_request():
    swap = SwapSpace(0)
    assert swap.can_hold(0) and not swap.can_hold(1) and swap.take(0) == []
