"""The host swap space: the blocks of host memory a swapped-out request's KV is copied to
(ModelRunner allocates them; --swap-space), handed out and taken back by id."""

from __future__ import annotations


class SwapSpace:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free_blocks: list[int] = list(range(num_blocks - 1, -1, -1))  # next: the last

    def can_hold(self, num_blocks: int) -> bool:
        return num_blocks <= len(self.free_blocks)

    def take(self, num_blocks: int) -> list[int]:
        """`num_blocks` free host blocks (the caller checked can_hold)."""
        return [self.free_blocks.pop() for _ in range(num_blocks)]

    def give_back(self, host_blocks: list[int]) -> None:
        """Free the host blocks; the first is handed out first again."""
        self.free_blocks.extend(reversed(host_blocks))
