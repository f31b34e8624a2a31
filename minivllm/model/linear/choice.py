"""The measured choice between the ways one linear layer can run (`--kernel-choice measure`).

Some weights can run more than one way, each computing the same product up to the order
of its sums (or, for bf16, where x is rounded): fp32 through oneDNN's packed linear or
torch's F.linear (MKL); bf16 weights on AMX tiles, through oneDNN's native bf16 or
panel_gemm.c's panels. Which is faster depends on the CPU, the shape and the rows: on an AMX
Xeon oneDNN's bf16 linear ran 300-910 GFLOP/s where the tile kernel ran ~300 in the loop.

So at load, for each (ways, N, K) and each power-of-two bucket of row counts up to the
step's largest (measured up to MEASURED_MAX_ROWS; beyond, the largest measured decides),
each way is timed on random input at the bucket's two ends (timed_rows), the ways
alternating, best of REPEATS (the best, not the median: another process on the cores only
ever adds time). The faster over both ends runs that bucket. Times are kept in a
JSON file per machine (CPU model and flags, the kernels' ISA level, threads, torch), so the
next load of any model with those shapes measures nothing; ways that win no bucket are never
built, or dropped with their weights. `minivllm check-kernels MODEL --gemm` prints the table.
registry.build_linear hands each layer's ways here (a KernelChoice) where the engine measures.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from minivllm.core.step_batch import RowPadding, row_bucket
from minivllm.model.kernels import library
from minivllm.model.kernels.processor import cpu_description

MEASURED_MAX_ROWS = 512  # from here on every way runs at its large-batch speed
REPEATS = 3

Way = Callable[..., torch.Tensor]  # (x, residual=None) -> y: a linear layer
Timer = Callable[[dict[str, Way], int, int], dict[str, float]]  # (ways, K, rows) -> seconds


def row_buckets(max_rows: int) -> list[int]:
    """The row counts measured: 1, 2, 4, ... up to max_rows rounded up to a power of two
    (at most MEASURED_MAX_ROWS)."""
    top = min(1 << max(max_rows - 1, 0).bit_length(), MEASURED_MAX_ROWS)
    return [1 << i for i in range(top.bit_length())]


def timed_rows(top: int) -> list[int]:
    """The row counts the bucket ending at `top` is timed at: its top and, above 16 rows,
    its first count, where a way that wants oneDNN's padded row counts pays the most (129
    rows run as 192, core/step_batch.padded_rows). The bucket goes to the least sum: a way
    must win across the bucket, not at its top alone (oneDNN's bf16 won 512 rows by 3-5%
    on a Zen 5, and ran every 259-row step as 320 rows)."""
    return [top] if top <= 16 else [top // 2 + 1, top]


def time_ways(ways: dict[str, Way], k: int, rows: int) -> dict[str, float]:
    """Seconds of one call of each way on random [rows, k] input: each warmed up, then the
    ways in turn REPEATS times, the best of each."""
    x = torch.randn(rows, k)
    best = dict.fromkeys(ways, float("inf"))
    for way in ways.values():
        way(x)
    for _ in range(REPEATS):
        for name, way in ways.items():
            start = time.perf_counter()
            way(x)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def machine_key() -> dict:
    """What a measured time is valid for."""
    return {"cpu": cpu_description(), "kernels": library.isa_summary(),
            "threads": torch.get_num_threads(), "torch": torch.__version__}


def default_table_path() -> Path:
    key = json.dumps(machine_key(), sort_keys=True).encode()
    root = Path(os.environ.get("MINIVLLM_CACHE_DIR", Path.home() / ".cache" / "minivllm"))
    return root / "kernel_choice" / f"{hashlib.sha256(key).hexdigest()[:16]}.json"


class ChoiceTable:
    """Measured seconds by entry ("ways|NxK|bias|rows") and way, in a JSON file (None: in
    memory only). A file that cannot be read or written is measured again, never fatal."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.times: dict[str, dict[str, float]] = {}
        if path is not None and path.exists():
            try:
                self.times = json.loads(path.read_text())["times"]
            except (OSError, ValueError, KeyError, TypeError):
                self.times = {}

    def save(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"machine": machine_key(), "times": self.times},
                                      indent=1, sort_keys=True))
            tmp.replace(self.path)  # atomic: two engines starting at once both read whole files
        except OSError:
            pass


class ChosenLinear:
    """A linear whose row-count buckets run different ways (each the fastest measured)."""

    def __init__(self, ways: dict[str, Way], winners: list[str]) -> None:
        self.ways = ways  # the winning ways only
        self.winners = winners  # per row bucket (row_bucket)
        self._by_bucket = [ways[name] for name in winners]
        # oneDNN compiles a kernel per row count: the runner pads a step's rows in the
        # buckets a oneDNN way runs
        self.padding = RowPadding(tuple(getattr(way, "onednn", False)
                                        for way in self._by_bucket))

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return self._by_bucket[row_bucket(x.shape[0], len(self._by_bucket))](x, residual)


def row_padding(linears: list) -> RowPadding:
    """Where a step through these linears pads its rows: where any runs oneDNN (a chosen
    linear in its oneDNN buckets, any other linear with a oneDNN weight at every count)."""
    return RowPadding.union([
        lin.padding if isinstance(lin, ChosenLinear)
        else RowPadding((bool(getattr(lin, "onednn", False)),)) for lin in linears])


class KernelChoice:
    """What the model's linears choose with: the rows a step can bring (max_rows, and
    max_sampled_rows for the LM head), the table of times, and how a way is timed (tests
    give a fake timer)."""

    def __init__(self, max_rows: int, max_sampled_rows: int, table: ChoiceTable,
                 timer: Timer = time_ways) -> None:
        self.max_rows, self.max_sampled_rows = max_rows, max_sampled_rows
        self.table, self.timer = table, timer

    def times(self, builders: dict[str, Callable[[], Way]], n: int, k: int, bias: bool,
              max_rows: int) -> dict[int, dict[str, float]]:
        """bucket -> way -> seconds (summed over timed_rows) for every bucket up to
        max_rows, measured where the table has none."""
        counts = {top: timed_rows(top) for top in row_buckets(max_rows)}
        prefix = f"{'+'.join(builders)}|{n}x{k}|{'bias' if bias else 'no bias'}|"
        missing = [rows for each in counts.values() for rows in each
                   if prefix + str(rows) not in self.table.times]
        if missing:
            ways = {name: build() for name, build in builders.items()}
            for rows in missing:
                self.table.times[prefix + str(rows)] = self.timer(ways, k, rows)
            self.table.save()
        return {top: {name: sum(self.table.times[prefix + str(rows)][name] for rows in each)
                      for name in builders}
                for top, each in counts.items()}

    def choose(self, builders: dict[str, Callable[[], Way]], n: int, k: int, bias: bool,
               head: bool = False) -> Way:
        """The layer: the one way that wins every bucket, or a ChosenLinear over the
        winners. builders: name -> a function building that way, the engine's default
        first (it wins a tie). head: the LM head, whose largest call is the step's sampled
        rows (max_sampled_rows), not all of them (max_rows)."""
        if len(builders) == 1:
            return next(iter(builders.values()))()
        times = self.times(builders, n, k, bias,
                           self.max_sampled_rows if head else self.max_rows)
        winners = [min(builders, key=lambda name: row[name]) for row in times.values()]
        ways = {name: builders[name]() for name in dict.fromkeys(winners)}
        return next(iter(ways.values())) if len(ways) == 1 else ChosenLinear(ways, winners)
