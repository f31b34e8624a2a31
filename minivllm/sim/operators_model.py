"""The operator cost model (`--cost-model operators:PATH`): a step's time is the sum of the
operators the engine runs for it, each priced from a table of its own measured times on
this machine (`minivllm sim calibrate --operators`, sim/operators_calibrate.py; Vidur's
design: profile operators, predict each from its own inputs, interpolate).

    time = layers x (sum of the layer's linears at the step's rows
                     + prefill attention of each chunk (its new tokens, its cached context)
                     + decode attention (decodes, mean context))
         + LM head and sampler (at the sampled rows)
         + c_step + c_decode x decodes + c_prefill x prefill chunks
         + c_token x prefill tokens                       (the framework overhead)
         + swap copies (per token slot) + the disk tier's transfers (CostModel.disk_time)

Rows are the padded rows where the engine pads them (core/step_batch.RowPadding). Tables
are read piecewise-linearly between their measured points and extended along their last
segment beyond them (a step larger than the grid). The overhead is fitted to real steps:
what the tables do not explain (scheduling, input preparation, bookkeeping, and the
per-token ops we do not time one by one: norms, RoPE and the KV write; the activation is
timed with gate/up).

A table holds for the machine it was measured on: loading refuses another CPU or ISA level,
and, where the caller names them, other threads, dtype or KV cache dtype.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from minivllm.core.step_batch import RowPadding, StepBatch
from minivllm.sim.cost_model import MeasuredEngine

LINEARS = ("qkv", "o_proj", "gate_up", "down")
# The framework's time beside the operators: per step, per decode, per prefill chunk and per
# prefill token. Decodes apart: a decode is one sequence and one token, so one shared "per
# sequence" and "per token" term charged decodes what prefills' tokens cost (SmolLM2, 2
# threads: 1.47 ms a decode where the real steps added 0.2-0.6 ms beside the operators).
OVERHEAD_TERMS = ("step", "decode_seq", "prefill_seq", "prefill_token")


def interpolate(x: float, xs: list[float], ys: list[float]) -> float:
    """Piecewise linear through (xs, ys) (xs increasing), extended along the first and last
    segments; never below 0."""
    if len(xs) == 1:
        return max(0.0, ys[0])
    i = min(max(int(np.searchsorted(xs, x)), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def interpolate_2d(x: float, y: float, xs: list[float], ys: list[float],
                   table: list[list[float]]) -> float:
    """table[i][j] at (xs[i], ys[j]): along y in each row, then along x."""
    return interpolate(x, xs, [interpolate(y, ys, row) for row in table])


def machine_identity() -> dict:
    """What the tables hold for that the simulator can check without torch: the CPU (model
    and ISA flags) and the kernels' ISA level."""
    from minivllm.bench.machine import cpu_description
    from minivllm.model.kernels.isa import select

    return {"cpu": cpu_description(), "isa_level": select()[0]}


@dataclass
class OperatorCostModel(MeasuredEngine):
    tables: dict  # rows, linears, lm_head, sampler, prefill_attention, decode_attention
    overhead: dict[str, float]  # OVERHEAD_TERMS -> seconds per unit
    machine: dict  # cpu, isa_level, num_threads, dtype, quantization, kv_cache_dtype
    engine: dict  # num_layers, pads_rows, num_kv_blocks, block_size, ... (as a profile's)
    fit_error: dict = field(default_factory=dict)  # per step kind, on calibrate's steps
    source: str = "operators"

    def __post_init__(self) -> None:
        self.name = self.source
        self.kv_bytes_per_token = self.engine.get("kv_bytes_per_token")
        self.disk_read_bandwidth = self.engine.get("disk_read_bandwidth",
                                                   self.disk_read_bandwidth)
        self.disk_write_bandwidth = self.engine.get("disk_write_bandwidth",
                                                    self.disk_write_bandwidth)

    def check_machine(self, **expected) -> None:
        """ValueError naming each of `expected`'s entries the tables were not measured at."""
        differ = [f"{key} {self.machine.get(key)!r} (here {value!r})"
                  for key, value in expected.items() if self.machine.get(key) != value]
        if differ:
            raise ValueError(f"{self.source} was measured on another setup: "
                             f"{'; '.join(differ)}. Calibrate on this one: minivllm sim "
                             "calibrate --operators")

    # ---- the parts of a step ----------------------------------------------------------

    def linears_time(self, num_tokens: int) -> float:
        """One layer's linears over the step's rows."""
        rows = RowPadding.of(self.engine.get("pads_rows")).rows(num_tokens)
        grid = self.tables["rows"]
        return sum(interpolate(rows, grid, self.tables["linears"][name]["seconds"])
                   for name in LINEARS)

    def attention_time(self, b: StepBatch) -> float:
        """One layer's attention: each prefill chunk, then the decodes as one batch."""
        pre, dec = self.tables["prefill_attention"], self.tables["decode_attention"]
        chunks = b.prefill_chunks
        if not chunks and b.num_prefill_seqs:  # a batch built from the aggregates alone
            n = b.num_prefill_seqs
            chunks = [(b.num_prefill_tokens / n, b.prefill_context / n)] * n
        total = sum(interpolate_2d(q, c, pre["query_tokens"], pre["context"], pre["seconds"])
                    for q, c in chunks)
        if b.num_decode_seqs:
            total += interpolate_2d(b.num_decode_seqs, b.decode_context / b.num_decode_seqs,
                                    dec["batch"], dec["context"], dec["seconds"])
        return total

    def sampling_time(self, b: StepBatch) -> float:
        """The LM head and the sampler over the sampled rows (every decode at least)."""
        rows = max(b.num_sampled_seqs, b.num_decode_seqs)
        if not rows:
            return 0.0
        head, sampler = self.tables["lm_head"], self.tables["sampler"]
        head_rows = RowPadding.of(self.engine.get("pads_rows")).rows(rows)
        return (interpolate(head_rows, self.tables["rows"], head["seconds"])
                + interpolate(rows, sampler["rows"], sampler["seconds"]))

    def overhead_time(self, b: StepBatch) -> float:
        c = self.overhead
        return (c["step"] + c["decode_seq"] * b.num_decode_seqs
                + c["prefill_seq"] * b.num_prefill_seqs
                + c["prefill_token"] * b.num_prefill_tokens)

    def operators_time(self, b: StepBatch) -> float:
        """The timed operators alone (what the overhead fit subtracts)."""
        layers = self.engine["num_layers"]
        return (layers * (self.linears_time(b.num_tokens) + self.attention_time(b))
                + self.sampling_time(b) + self.tables["swap_seconds_per_token"]
                * b.num_swap_tokens)

    def step_time(self, b: StepBatch) -> float:
        return self.operators_time(b) + self.overhead_time(b) + self.disk_time(b)

    # ---- what the simulator reads -----------------------------------------------------

    def num_kv_blocks(self, block_size: int) -> int | None:
        total = self.engine.get("num_kv_blocks", 0) * self.engine.get("block_size", 0)
        return total // block_size or None

    def describe(self) -> dict:
        return {"name": self.name, "machine": self.machine, "engine": self.engine,
                "overhead": self.overhead, "fit_error": self.fit_error}

    def report(self) -> str:
        from minivllm.sim.step_kinds import describe

        c = self.overhead
        return (f"operator tables of {self.engine.get('model')} on {self.machine.get('cpu')}, "
                f"{self.machine.get('num_threads')} thread(s), {self.machine.get('dtype')}: "
                f"overhead {c['step'] * 1e3:.3g} ms a step + {c['decode_seq'] * 1e6:.3g} us a "
                f"decode + {c['prefill_seq'] * 1e6:.3g} us a prefill chunk + "
                f"{c['prefill_token'] * 1e6:.3g} us a prefill token; step time error (median "
                f"/ p90) on calibrate's steps: {describe(self.fit_error)}")

    # ---- JSON -------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"kind": "operators", "machine": self.machine,
                                    "engine": self.engine, "tables": self.tables,
                                    "overhead": self.overhead, "fit_error": self.fit_error},
                                   indent=1))

    @classmethod
    def load(cls, path: str | Path, **expected) -> OperatorCostModel:
        """The tables at `path`, refused unless measured on this machine (CPU and ISA
        level) and at `expected` (num_threads, dtype, kv_cache_dtype: those given)."""
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read operator tables from {path}: {e}") from None
        if not isinstance(doc, dict) or doc.get("kind") != "operators":
            raise ValueError(f"{path}: not operator tables (made by minivllm sim calibrate "
                             "--operators)")
        missing = [key for key in ("machine", "engine", "tables", "overhead") if key not in doc]
        missing += [f"overhead.{t}" for t in OVERHEAD_TERMS if t not in doc.get("overhead", {})]
        if missing:
            raise ValueError(f"{path}: operator tables without {', '.join(missing)}")
        model = cls(doc["tables"], doc["overhead"], doc["machine"], doc["engine"],
                    doc.get("fit_error", {}), f"operators:{path}")
        model.check_machine(**machine_identity(), **expected)
        return model
