"""A linear model of seconds, fitted online: seconds = sum of c_i x feature_i, by least
squares on relative error, old observations forgotten geometrically (the machine's speed
drifts), no negative coefficient (a term that fits negative is dropped, as is one that never
was nonzero or that the observations cannot tell from the others). Pure Python: the normal
equations are a few rows. The scheduler's step-time model (step_cost.py) and speculation's
price of a draft (spec_decoding.py) are two of them."""

from __future__ import annotations


def _solve(a: list[list[float]], y: list[float], tol: float) -> list[float] | None:
    """x with a x = y by Gaussian elimination with partial pivoting; None if singular, or
    if a pivot is at most tol times its column's diagonal."""
    n = len(y)
    m = [row[:] + [v] for row, v in zip(a, y, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        # a normal matrix's pivot is what its feature varies apart from the earlier ones,
        # relative to its diagonal: ~0 (rounding) where it is their sum (collinear)
        if abs(m[pivot][col]) <= tol * abs(a[col][col]) or abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    return [m[i][n] / m[i][i] for i in range(n)]


class OnlineLinearFit:
    def __init__(self, num_features: int, forget: float = 0.995, min_steps: int = 16,
                 collinear: float = 0.0) -> None:
        """collinear: a feature whose variation apart from the earlier ones is at most this
        fraction of its own is dropped (0: only an exactly singular system drops one)."""
        self.num_features, self.collinear = num_features, collinear
        self.forget = forget  # each observation's weight decays by this per later one
        self.min_steps = min_steps  # observations before the model predicts
        self.num_steps = 0
        self.coefficients = [0.0] * num_features
        self._xtx = [[0.0] * num_features for _ in range(num_features)]
        self._xty = [0.0] * num_features
        self._seen = [False] * num_features  # a feature never nonzero has no coefficient

    @property
    def ready(self) -> bool:
        return self.num_steps >= self.min_steps

    def observe(self, x: list[float], seconds: float) -> None:
        if seconds <= 0:
            return
        w = 1.0 / seconds  # relative error: rows scaled by 1 / y
        n = self.num_features
        for i in range(n):
            self._seen[i] = self._seen[i] or x[i] != 0
            self._xty[i] = self.forget * self._xty[i] + x[i] * w * w * seconds
            for j in range(n):
                self._xtx[i][j] = self.forget * self._xtx[i][j] + x[i] * x[j] * w * w
        self.num_steps += 1
        self._refit()

    def _refit(self) -> None:
        active = [i for i in range(self.num_features) if self._seen[i]]
        while active:
            coef = _solve([[self._xtx[i][j] for j in active] for i in active],
                          [self._xty[i] for i in active], self.collinear)
            if coef is None:  # too few distinct observations yet: drop the last term, retry
                active.pop()
                continue
            negative = [i for i, c in zip(active, coef, strict=True) if c < 0]
            if not negative:
                self.coefficients = [0.0] * self.num_features
                for i, c in zip(active, coef, strict=True):
                    self.coefficients[i] = c
                return
            active.remove(negative[0])

    def predict(self, x: list[float]) -> float:
        return sum(c * v for c, v in zip(self.coefficients, x, strict=True))
