"""The scheduler's own model of how long a step takes, learned from the steps it runs, so it
can pack a step to a time (`target_tpot_ms`): every decode in a step waits for the whole
step, so a step's time is the TPOT of each of its decodes, and a prefill chunk that would
push it past the target is cut to what fits.

    seconds = c_step + c_token x new tokens + c_attention x prefill query-key pairs
            + c_context x decode context tokens

fitted by least squares on relative error (as sim/profile.py fits a profile offline), with
old steps forgotten geometrically (the machine's speed drifts) and no negative coefficient
(a term that fits negative is dropped). Pure Python: the normal equations are 4 x 4.
"""

from __future__ import annotations

from dataclasses import replace

from minivllm.core.step_batch import StepBatch

_NUM_FEATURES = 4


def _features(b: StepBatch) -> list[float]:
    return [1.0, float(b.num_tokens), float(b.prefill_attention), float(b.decode_context)]


def _solve(a: list[list[float]], y: list[float]) -> list[float] | None:
    """x with a x = y by Gaussian elimination with partial pivoting; None if singular."""
    n = len(y)
    m = [row[:] + [v] for row, v in zip(a, y, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    return [m[i][n] / m[i][i] for i in range(n)]


class OnlineStepCost:
    """Step seconds from a StepBatch, fitted to the steps observed so far."""

    def __init__(self, forget: float = 0.995, min_steps: int = 16) -> None:
        self.forget = forget  # each step's weight in the fit decays by this per later step
        self.min_steps = min_steps  # steps observed before the model predicts
        self.num_steps = 0
        self.coefficients = [0.0] * _NUM_FEATURES
        self._xtx = [[0.0] * _NUM_FEATURES for _ in range(_NUM_FEATURES)]
        self._xty = [0.0] * _NUM_FEATURES
        self._seen = [False] * _NUM_FEATURES  # a feature never nonzero has no coefficient

    @property
    def ready(self) -> bool:
        return self.num_steps >= self.min_steps

    def observe(self, batch: StepBatch, seconds: float) -> None:
        if seconds <= 0 or batch.num_tokens == 0:
            return
        x, w = _features(batch), 1.0 / seconds  # relative error: rows scaled by 1 / y
        for i in range(_NUM_FEATURES):
            self._seen[i] = self._seen[i] or x[i] != 0
            self._xty[i] = self.forget * self._xty[i] + x[i] * w * w * seconds
            for j in range(_NUM_FEATURES):
                self._xtx[i][j] = self.forget * self._xtx[i][j] + x[i] * x[j] * w * w
        self.num_steps += 1
        self._refit()

    def _refit(self) -> None:
        active = [i for i in range(_NUM_FEATURES) if self._seen[i]]
        while active:
            coef = _solve([[self._xtx[i][j] for j in active] for i in active],
                          [self._xty[i] for i in active])
            if coef is None:  # too few distinct steps yet: drop the last term and retry
                active.pop()
                continue
            negative = [i for i, c in zip(active, coef, strict=True) if c < 0]
            if not negative:
                self.coefficients = [0.0] * _NUM_FEATURES
                for i, c in zip(active, coef, strict=True):
                    self.coefficients[i] = c
                return
            active.remove(negative[0])

    def step_time(self, batch: StepBatch) -> float:
        return sum(c * x for c, x in zip(self.coefficients, _features(batch), strict=True))

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
