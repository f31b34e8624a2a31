"""The scheduler's own model of how long a step takes, learned from the steps it runs, so it
can pack a step to a time (`target_tpot_ms`): every decode in a step waits for the whole
step, so a step's time is the TPOT of each of its decodes, and a prefill chunk that would
push it past the target is cut to what fits.

    seconds = c_step + c_token x new tokens + c_attention x prefill query-key pairs
            + c_context x decode context tokens

fitted online as core/online_fit.py fits (least squares on relative error, as sim/profile.py
fits a profile offline; old steps forgotten, no negative coefficient).
"""

from __future__ import annotations

from dataclasses import replace

from minivllm.core.online_fit import OnlineLinearFit
from minivllm.core.step_batch import StepBatch

_NUM_FEATURES = 4


def _features(b: StepBatch) -> list[float]:
    return [1.0, float(b.num_tokens), float(b.prefill_attention), float(b.decode_context)]


class OnlineStepCost(OnlineLinearFit):
    """Step seconds from a StepBatch, fitted to the steps observed so far."""

    def __init__(self, forget: float = 0.995, min_steps: int = 16) -> None:
        super().__init__(_NUM_FEATURES, forget, min_steps)

    def observe(self, batch: StepBatch, seconds: float) -> None:
        if batch.num_tokens:
            super().observe(_features(batch), seconds)

    def step_time(self, batch: StepBatch) -> float:
        return self.predict(_features(batch))

    def prefill_seconds(self, decodes: StepBatch, num_tokens: int, budget: int) -> float:
        """Predicted seconds to prefill num_tokens prompt tokens in steps beside `decodes`
        (each step: the decodes and a budget's worth of prompt, `budget` tokens a step)."""
        chunk = max(2, budget - decodes.num_decode_seqs)
        # The step that computes a prompt's last token is full whenever more prompts wait
        # behind it, so every step counts whole, but for a prefill that fits one step.
        steps = -(-num_tokens // chunk)
        batch = replace(decodes)
        batch.add(max(2, min(num_tokens, chunk)), 0)  # (one token would count as a decode)
        return steps * self.step_time(batch)

    def max_prefill_tokens(self, batch: StepBatch, context: int, limit: int,
                           seconds: float) -> int:
        """The most new tokens (at most `limit`) a prefill chunk after `context` computed
        tokens may add to `batch` with the step's predicted time still within `seconds`
        (the prediction grows with the chunk: every coefficient is >= 0)."""
        def fits(n: int) -> bool:
            b = replace(batch)
            b.add(n, context)
            return self.step_time(b) <= seconds

        if fits(limit):
            return limit
        low, high = 0, limit  # fits(low) or low == 0; not fits(high)
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        return low
