"""How well an output-length predictor ranks requests: Kendall's tau-b between predicted
and true output lengths, and the mean absolute error (tokens). What `bench` and `sim`
summaries report per run (core/length_predictor.py makes the predictions).

The prediction scored is the one the policy ranked a request by when it admitted it (first
scheduled: with what had finished by then), and for `probe` the one made when the prefill
handed over the hidden state (Request.predicted_output_len).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-b (ties in either variable corrected for, as scipy.stats.kendalltau's
    default): (concordant - discordant) / sqrt((n0 - ties_x) (n0 - ties_y)). O(n^2) pairs in
    blocks of rows; None below two values or when either side is constant."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"kendall_tau: {a.size} predictions for {b.size} true values")
    n = a.size
    if n < 2:
        return None
    score = 0
    tied_x = tied_y = 0  # pairs tied in x, in y (including pairs tied in both)
    step = max(1, 4_000_000 // n)
    for start in range(0, n - 1, step):
        rows = np.arange(start, min(start + step, n - 1))
        da = np.sign(a[rows, None] - a[None, :])
        db = np.sign(b[rows, None] - b[None, :])
        upper = np.arange(n)[None, :] > rows[:, None]  # each pair once (i < j)
        score += int((da * db)[upper].sum())
        tied_x += int((da == 0)[upper].sum())
        tied_y += int((db == 0)[upper].sum())
    pairs = n * (n - 1) // 2
    denom = ((pairs - tied_x) * (pairs - tied_y)) ** 0.5
    return score / denom if denom else None


def quality(predicted: Sequence[float | None], true: Sequence[int]) -> dict:
    """{'n', 'kendall_tau', 'mae', 'mean_predicted', 'mean_true'} over the pairs that have a
    prediction."""
    pairs = [(p, t) for p, t in zip(predicted, true) if p is not None]
    if not pairs:
        return {"n": 0, "kendall_tau": None, "mae": None, "mean_predicted": None,
                "mean_true": None}
    p = np.array([p for p, _ in pairs], dtype=float)
    t = np.array([t for _, t in pairs], dtype=float)
    return {"n": len(pairs), "kendall_tau": kendall_tau(p, t),
            "mae": float(np.abs(p - t).mean()), "mean_predicted": float(p.mean()),
            "mean_true": float(t.mean())}


def read_prediction_log(path: str | Path, start: int = 0) -> list[dict]:
    """The engine's --length-prediction-log: one JSON object per finished request; `start`:
    the byte offset to read from (the file's size before a run: the lines it added)."""
    p = Path(path)
    if not p.exists():
        return []
    with open(p, "rb") as f:
        f.seek(start)
        text = f.read().decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def quality_from_log(rows: list[dict]) -> dict:
    """quality() over the log's rows, with `held_out`: quality() over the second half in
    finish order, predicted once the predictor had learned from most of the first half --
    what an online predictor (`probe`, `bucket`) scores on requests it had not trained on,
    past its cold start."""
    out = quality([r["predicted"] for r in rows], [r["output_tokens"] for r in rows])
    late = rows[len(rows) // 2:]
    out["held_out"] = quality([r["predicted"] for r in late], [r["output_tokens"] for r in late])
    queue = [r["queue_s"] for r in rows if r.get("queue_s") is not None]
    out["max_queue_s"] = max(queue) if queue else None
    return out


def describe(q: dict | None) -> str:
    """'Kendall tau 0.41, MAE 37.2 tokens (n=128); second half (held out) tau 0.45 (n=64)'
    or 'no predictions'."""
    if not q or not q.get("n"):
        return "no predictions"
    tau = "-" if q["kendall_tau"] is None else f"{q['kendall_tau']:.3f}"
    text = f"Kendall tau {tau}, MAE {q['mae']:.1f} tokens (n={q['n']})"
    late = q.get("held_out") or {}
    if late.get("n"):
        late_tau = "-" if late["kendall_tau"] is None else f"{late['kendall_tau']:.3f}"
        text += f"; second half (held out) tau {late_tau} (n={late['n']})"
    return text
