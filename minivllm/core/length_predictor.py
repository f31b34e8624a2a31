"""Output-length predictors: what SJF (and any policy that wants one) thinks a request will
generate. One small interface, one registry line each, selected with --length-predictor.

`predict(request)` returns the predicted TOTAL number of output tokens (not what is left),
clamped to [1, max_tokens]; `observe(request)` is the feedback when a request finishes
(not when it is aborted), with its true output length in `request.num_output_tokens`.

- `mean`: max_tokens until one request has finished, then the running mean of finished ones.
- `oracle`: the true output length, from the request's `oracle_output_len` — a field only the lab
  sets (bench replaying a trace, the simulator). An upper bound to compare against; without
  the field it falls back to `mean`.
- `bucket`: per prompt-length bucket (powers of two), a running quantile (the median by
  default) of the output lengths finished in that bucket; the global one while the bucket
  has seen too few.
- `probe`: ridge regression, refitted online from finished requests, of log(output length)
  on the served model's final-norm hidden state of the prompt's last token
  (`request.prompt_hidden`, which the runner hands over when the prefill completes, at no
  extra forward). Before a request's prefill there is no hidden state: it predicts as
  `bucket` does until then.

Pure Python where the scheduler imports it (core/ loads no torch or numpy); `probe` imports
numpy when it first learns.
"""

from __future__ import annotations

import math
import weakref
from abc import ABC, abstractmethod
from bisect import insort
from collections import deque
from typing import Any

from minivllm.core.request import Request

LENGTH_PREDICTORS: dict[str, type[LengthPredictor]] = {}


def register_predictor(name: str):
    def wrap(cls: type[LengthPredictor]) -> type[LengthPredictor]:
        cls.name = name
        LENGTH_PREDICTORS[name] = cls
        return cls

    return wrap


def check_length_predictor(name: str) -> None:
    if name not in LENGTH_PREDICTORS:
        raise ValueError(f"unknown length_predictor {name!r}; known predictors: "
                         f"{', '.join(sorted(LENGTH_PREDICTORS))}")


def make_length_predictor(name: str = "mean") -> LengthPredictor:
    check_length_predictor(name)
    return LENGTH_PREDICTORS[name]()


def clamp(value: float, request: Request) -> float:
    return float(min(max(value, 1.0), max(1, request.max_tokens)))


class LengthPredictor(ABC):
    name = "abstract"
    # Whether it reads the prompt's last hidden state (the runner computes the row only then).
    needs_hidden_state = False

    def predict(self, request: Request) -> float:
        """Predicted total output tokens of the request, within [1, max_tokens]."""
        return clamp(self._predict(request), request)

    @abstractmethod
    def _predict(self, request: Request) -> float:
        """The unclamped prediction."""

    def observe(self, request: Request) -> None:
        """A request finished (not aborted): learn from its true output length."""

    def unasked(self, requests: list[Request]) -> bool:
        """The scheduler skips predicting for `requests` now (it left them unranked): do
        what predicting would have changed, and return True; False, the default: it cannot
        say, so the scheduler predicts as ever."""
        return False


@register_predictor("mean")
class MeanPredictor(LengthPredictor):
    """Its max_tokens, capped by the mean output length of the requests finished so far
    (max_tokens alone until one has finished)."""

    def __init__(self) -> None:
        self.num_finished = 0
        self.total_output_tokens = 0

    def _predict(self, request: Request) -> float:
        if self.num_finished == 0:
            return request.max_tokens
        return round(self.total_output_tokens / self.num_finished)

    def unasked(self, requests: list[Request]) -> bool:
        return True  # a prediction only reads

    def observe(self, request: Request) -> None:
        self.num_finished += 1
        self.total_output_tokens += request.num_output_tokens


@register_predictor("oracle")
class OraclePredictor(LengthPredictor):
    """The true output length, where the lab knows it (its oracle_output_len)."""

    def __init__(self) -> None:
        self.fallback = MeanPredictor()

    def _predict(self, request: Request) -> float:
        oracle_output_len = request.core_request.oracle_output_len
        if oracle_output_len is not None:
            return oracle_output_len
        return self.fallback._predict(request)

    def unasked(self, requests: list[Request]) -> bool:
        return True  # a prediction only reads

    def observe(self, request: Request) -> None:
        self.fallback.observe(request)


class RunningQuantile:
    """A quantile of the last `window` values (kept sorted; inserts are O(window))."""

    def __init__(self, q: float, window: int = 512) -> None:
        self.q = q
        self.recent: deque[float] = deque(maxlen=window)
        self.sorted: list[float] = []

    def __len__(self) -> int:
        return len(self.recent)

    def add(self, value: float) -> None:
        if len(self.recent) == self.recent.maxlen:
            self.sorted.remove(self.recent[0])
        self.recent.append(value)
        insort(self.sorted, value)

    def value(self) -> float:
        """Linear interpolation between order statistics (numpy's default)."""
        if not self.sorted:
            raise ValueError("no values yet")
        pos = self.q * (len(self.sorted) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(self.sorted) - 1)
        return self.sorted[lo] + (self.sorted[hi] - self.sorted[lo]) * (pos - lo)


def prompt_bucket(num_prompt_tokens: int) -> int:
    """Powers of two: bucket b holds prompts of [2^b, 2^(b+1)) tokens."""
    return max(0, num_prompt_tokens).bit_length()


@register_predictor("bucket")
class BucketPredictor(LengthPredictor):
    """Per prompt-length bucket, a running quantile of finished output lengths."""

    def __init__(self, quantile: float = 0.5, min_samples: int = 4, window: int = 512) -> None:
        self.quantile, self.min_samples, self.window = quantile, min_samples, window
        self.buckets: dict[int, RunningQuantile] = {}
        self.overall = RunningQuantile(quantile, window)

    def _predict(self, request: Request) -> float:
        bucket = self.buckets.get(prompt_bucket(request.num_prompt_tokens))
        if bucket is not None and len(bucket) >= self.min_samples:
            return bucket.value()
        if len(self.overall):
            return self.overall.value()
        return request.max_tokens

    def unasked(self, requests: list[Request]) -> bool:
        return True  # a prediction only reads

    def observe(self, request: Request) -> None:
        key = prompt_bucket(request.num_prompt_tokens)
        if key not in self.buckets:
            self.buckets[key] = RunningQuantile(self.quantile, self.window)
        self.buckets[key].add(request.num_output_tokens)
        self.overall.add(request.num_output_tokens)


class OnlineRidge:
    """Ridge regression y ~ w.x + b from sufficient statistics (sums of x, x x^T, x y), so
    memory is d^2 whatever the number of samples. Features are standardized by their mean
    and standard deviation; the bias is not penalized. Refitted lazily, when predicting,
    once the samples have grown by a quarter since the last fit (a d x d solve each: in the
    engine, where OpenBLAS's threads compete with torch's, a 160 x 160 solve took up to
    ~80 ms, against ~1 ms alone)."""

    def __init__(self, alpha: float = 1.0) -> None:
        self.alpha = alpha
        self.n = 0
        self.fitted_n = 0
        self.sum_x: Any = None
        self.sum_xx: Any = None
        self.sum_xy: Any = None
        self.sum_y = 0.0
        self.weights: Any = None
        self.bias = 0.0
        self.mean: Any = None
        self.scale: Any = None

    def add(self, x, y: float) -> None:
        import numpy as np

        x = np.asarray(x, dtype=np.float64).ravel()
        if self.sum_x is None:
            d = x.shape[0]
            self.sum_x, self.sum_xx, self.sum_xy = np.zeros(d), np.zeros((d, d)), np.zeros(d)
        self.n += 1
        self.sum_x += x
        self.sum_xx += x[:, None] * x[None, :]
        self.sum_xy += x * y
        self.sum_y += y

    def fit(self) -> None:
        import numpy as np

        n = self.n
        mean = self.sum_x / n
        y_mean = self.sum_y / n
        cov = self.sum_xx / n - mean[:, None] * mean[None, :]  # centered second moments
        scale = np.sqrt(np.clip(np.diag(cov), 1e-12, None))
        cov_std = cov / (scale[:, None] * scale[None, :])
        xy_std = (self.sum_xy / n - mean * y_mean) / scale
        # Minimizing sum (y - b - w.z)^2 + alpha |w|^2 over standardized z:
        # (C + alpha / n I) w = c, b = mean(y).
        w = np.linalg.solve(cov_std + (self.alpha / n) * np.eye(len(mean)), xy_std)
        self.mean, self.scale, self.weights, self.bias = mean, scale, w, y_mean
        self.fitted_n = n

    def maybe_fit(self) -> None:
        grown = self.n - self.fitted_n >= max(1, self.fitted_n // 4)
        if self.n and (self.weights is None or grown):
            self.fit()

    def predict(self, x) -> float:
        import numpy as np

        if self.n == 0:
            raise ValueError("no samples yet")
        self.maybe_fit()
        z = (np.asarray(x, dtype=np.float64).ravel() - self.mean) / self.scale
        return float((z * self.weights).sum() + self.bias)


@register_predictor("probe")
class ProbePredictor(LengthPredictor):
    """Ridge on the prompt's last hidden state, predicting log(1 + output tokens), refitted
    from every finished request that had one. Until `min_samples` have finished, and for a
    request not yet prefilled, it predicts as `bucket`."""

    needs_hidden_state = True

    def __init__(self, alpha: float = 10.0, min_samples: int = 8,
                 max_features: int = 256) -> None:
        self.ridge = OnlineRidge(alpha)
        self.min_samples = min_samples
        self.max_features = max_features
        self._projection: Any = None
        self.fallback = BucketPredictor()
        # A request's prediction changes only when the ridge learns: SJF asks at every sort
        # of every step, so keep it per request until then (weakly: requests come and go).
        self._cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _predict(self, request: Request) -> float:
        if request.prompt_hidden is None or self.ridge.n < self.min_samples:
            return self.fallback._predict(request)
        self.ridge.maybe_fit()
        cached = self._cache.get(request)
        if cached is not None and cached[0] == self.ridge.fitted_n:
            return cached[1]
        value = math.expm1(min(self.ridge.predict(self.features(request)), 30.0))
        self._cache[request] = (self.ridge.fitted_n, value)
        return value

    def unasked(self, requests: list[Request]) -> bool:
        """Predicting for a prefilled request refits the ridge once it has grown (the
        fit depends on when it is asked): refit now if one of them would have; the cache
        is keyed by the fit, so it answers the same whenever filled."""
        if self.ridge.n >= self.min_samples and any(r.prompt_hidden is not None
                                                    for r in requests):
            self.ridge.maybe_fit()
        return True

    def features(self, request: Request):
        """The hidden state, or for a model wider than max_features its fixed random
        projection to max_features dimensions (seeded Gaussian / sqrt(k): distances kept
        within a few percent), so a refit stays a small solve (Qwen2.5-7B: 3584 -> 256)."""
        import numpy as np

        x = np.asarray(request.prompt_hidden, dtype=np.float64).ravel()
        if x.size <= self.max_features:
            return x
        if self._projection is None or self._projection.shape[0] != x.size:
            rng = np.random.default_rng(0)
            self._projection = (rng.standard_normal((x.size, self.max_features))
                                / math.sqrt(self.max_features))
        return (x[:, None] * self._projection).sum(axis=0)

    def observe(self, request: Request) -> None:
        self.fallback.observe(request)
        if request.prompt_hidden is not None:
            self.ridge.add(self.features(request), math.log1p(request.num_output_tokens))
