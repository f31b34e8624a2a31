"""The profile cost model: step time as a linear function of the step's composition, fitted
to the real engine's measured steps (`minivllm sim calibrate`), saved as JSON.

    time = c_step + c_prefill_seq x prefill seqs + c_prefill_token x prefill tokens
         + c_prefill_attention x query-key pairs + c_decode_seq x decode seqs
         + c_decode_context x decode context tokens + c_swap_token x swapped token slots
         + c_pad_token x padding rows

Each term is one cost the engine pays: a fixed step overhead, per-sequence bookkeeping, the
weights' matmuls per token, attention per query-key pair (prefill) or per context token
(decode), and the rows an engine that pads its steps to oneDNN's buckets computes for
nothing (core/step_batch.RowPadding; the profile records in which row buckets it pads). The
fit is least squares on relative error (a 5 ms decode step counts as much as a 500 ms
prefill step), with no negative coefficient (a term that fits negative is dropped and
the fit redone). The JSON also records the engine the steps were measured on (KV blocks,
block size, context, KV bytes per token), which become the simulator's defaults.

Another --kv-cache-dtype than the profile's (sim/kv_bytes.py, from the KV shape the profile
records): the same KV memory holds blocks of its bytes, and c_decode_context scales with the
bytes a decode reads (our assumption: decode attention is bound by its KV reads; calibrate at
that dtype to measure it instead). The disk tier's transfers (CostModel.disk_time) are priced
at the read and write rates calibrate measured on the machine's disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from minivllm.core.step_batch import RowPadding, StepBatch
from minivllm.sim.cost_model import CostModel, MeasuredEngine
from minivllm.sim.kv_bytes import kv_bytes_per_token
from minivllm.sim.step_kinds import describe

FEATURES = ("step", "num_prefill_seqs", "num_prefill_tokens", "prefill_attention",
            "num_decode_seqs", "decode_context", "num_swap_tokens", "num_pad_tokens")


def features(b: StepBatch, padding: RowPadding = RowPadding()) -> list[float]:
    pad = padding.rows(b.num_tokens) - b.num_tokens
    return [1.0, b.num_prefill_seqs, b.num_prefill_tokens, b.prefill_attention,
            b.num_decode_seqs, b.decode_context, b.num_swap_tokens, pad]


def nonnegative_fit(x: np.ndarray, target: np.ndarray, seconds: np.ndarray,
                    names: tuple[str, ...]) -> dict[str, float]:
    """Coefficients >= 0, one per column of x (named), for x @ c ~= target, least squares on
    the error relative to each step's measured seconds (a 5 ms step counts as much as a
    500 ms one); a term that fits negative is dropped and the fit redone, as are columns
    that are zero throughout."""
    weight = 1.0 / seconds
    active = [j for j in range(x.shape[1]) if np.any(x[:, j])]
    coef = np.zeros(0)
    while active:
        coef, *_ = np.linalg.lstsq(x[:, active] * weight[:, None], target * weight, rcond=None)
        negative = [j for j, c in zip(active, coef, strict=True) if c < 0]
        if not negative:
            break
        active.remove(negative[0])
        coef = np.zeros(0)  # every term negative: all of them 0
    out = dict.fromkeys(names, 0.0)
    out.update({names[j]: float(c) for j, c in zip(active, coef, strict=True)})
    return out


def fit(batches: list[StepBatch], seconds: list[float],
        padding: RowPadding = RowPadding()) -> dict[str, float]:
    """The profile's coefficients: nonnegative_fit of the step times on their features."""
    x = np.asarray([features(b, padding) for b in batches], dtype=float)
    y = np.asarray(seconds, dtype=float)
    if len(y) < len(FEATURES):
        raise ValueError(f"need at least {len(FEATURES)} timed steps to fit, got {len(y)}")
    return nonnegative_fit(x, y, y, FEATURES)


@dataclass
class ProfileCostModel(MeasuredEngine):
    coefficients: dict[str, float]
    engine: dict  # num_kv_blocks, block_size, max_model_len, kv_bytes_per_token, model, ...
    fit_error: dict = field(default_factory=dict)  # mean / p90 relative error on the steps
    source: str = "profile"
    kv_cache_dtype: str | None = None  # the simulated KV cache's (None: the profile's)

    def __post_init__(self) -> None:
        self.name = self.source
        self._coef = [self.coefficients.get(f, 0.0) for f in FEATURES]
        self._padding = RowPadding.of(self.engine.get("pads_rows"))
        measured = self.engine.get("kv_bytes_per_token")
        self.kv_bytes_per_token = measured
        if self.kv_cache_dtype not in (None, self.engine.get("kv_cache_dtype", "auto")):
            shape = self.engine.get("kv_shape")  # layers, KV heads, head dim, dtype bytes
            if not (shape and measured):
                raise ValueError(f"{self.source} records no KV shape: calibrate again to "
                                 f"simulate --kv-cache-dtype {self.kv_cache_dtype}")
            self.kv_bytes_per_token = kv_bytes_per_token(*shape, self.kv_cache_dtype)
            self._coef[FEATURES.index("decode_context")] *= self.kv_bytes_per_token / measured
        self.disk_read_bandwidth = self.engine.get("disk_read_bandwidth",
                                                   self.disk_read_bandwidth)
        self.disk_write_bandwidth = self.engine.get("disk_write_bandwidth",
                                                    self.disk_write_bandwidth)

    def step_time(self, b: StepBatch) -> float:
        return (sum(c * x for c, x in zip(self._coef, features(b, self._padding), strict=True))
                + self.disk_time(b))

    def num_kv_blocks(self, block_size: int) -> int | None:
        """The KV memory the profiled engine had, in blocks at the simulated KV dtype."""
        total = self.engine.get("num_kv_blocks", 0) * self.engine.get("block_size", 0)
        measured = self.engine.get("kv_bytes_per_token")
        if measured:
            return int(total * measured // (self.kv_bytes_per_token * block_size)) or None
        return total // block_size or None

    def describe(self) -> dict:
        return {"name": self.name, "coefficients": self.coefficients, "engine": self.engine,
                "fit_error": self.fit_error, "kv_cache_dtype": self.kv_cache_dtype,
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "disk_read_bandwidth": self.disk_read_bandwidth,
                "disk_write_bandwidth": self.disk_write_bandwidth}

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"kind": "profile", "coefficients": self.coefficients,
                                    "engine": self.engine, "fit_error": self.fit_error},
                                   indent=1))

    @classmethod
    def load(cls, path: str | Path, kv_cache_dtype: str | None = None) -> CostModel:
        """The profile; with the served terms `sim calibrate --served` added, as the server
        takes its steps (ServedCostModel)."""
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read a profile from {path}: {e}") from None
        if not isinstance(doc, dict) or doc.get("kind") != "profile":
            raise ValueError(f"{path}: not a profile (made by minivllm sim calibrate)")
        unknown = set(doc.get("coefficients", {})) - set(FEATURES)
        if unknown or not doc.get("coefficients"):
            raise ValueError(f"{path}: coefficients must be some of {', '.join(FEATURES)}; "
                             f"got {sorted(doc.get('coefficients', {}))}")
        model = cls(doc["coefficients"], doc.get("engine", {}), doc.get("fit_error", {}),
                    f"profile:{path}", kv_cache_dtype)
        if "served" not in doc:
            return model
        from minivllm.sim.served_overhead import ServedCostModel, ServedOverhead

        return ServedCostModel(model, ServedOverhead.from_dict(doc["served"], str(path)))

    def report(self) -> str:
        terms = ", ".join(f"{k} {v * 1e3:.4g} ms" for k, v in self.coefficients.items() if v)
        err = self.fit_error
        return (f"profile of {self.engine.get('model')}: {terms} (per unit); fit over "
                f"{err.get('num_steps')} steps: mean relative error {err.get('mean', 0):.1%}, "
                f"p90 {err.get('p90', 0):.1%}"
                + (f" (median / p90 per step kind: {describe(err['by_kind'])})"
                   if "by_kind" in err else "")
                + f"; disk tier read "
                f"{self.disk_read_bandwidth / 1e9:.3g} GB/s, written "
                f"{self.disk_write_bandwidth / 1e9:.3g} GB/s")
