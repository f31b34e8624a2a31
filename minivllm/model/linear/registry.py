"""How a linear layer runs: the one table from a weight's format, what this machine runs and
the rows of a call to the implementation that computes it. Model code calls build_linear
and never names an implementation.

- Format (weight_format): "float" (the model's dtype: fp32 on the CPU, whatever F.linear
  takes elsewhere), "bf16" (bf16 weights, fp32 activations: the CPU's bf16), "int8" (W8A8,
  quantized at load) or "gguf" (a GGUF file's blocks as stored).
- Machine: what the C kernels run at the ISA level they were built for (AMX tiles, the
  panels, bf16 dot products) and whether oneDNN's bf16 runs on native bf16 products.
- FORMATS lists each format's ways in order of preference. A Way names its implementation
  (a module here each: onednn.py, panels.py, amx.py, int8.py, gguf.py), says where it runs
  (a predicate over the Site: the weight, whether the fast paths may run, the LM head or
  not, the Machine) and builds the layer. Of the ways that run here the first is the
  default; where none does, the format's fallback runs.
- Rows: without a KernelChoice the default runs every row count; with one (choice.py,
  `--kernel-choice measure`) each way that runs here is timed per bucket of row counts and
  the winners run their buckets (a ChosenLinear). Within a way, rows can decide too: the
  int8 and GGUF kernels take the AMX tiles from AMX_MIN_ROWS rows (kernels/linear_ops.py).

To add a format:
1. Write its layer in a module of its own here: built from the weight [N, K] and the bias,
   called as layer(x [T, K] fp32, residual=None) -> y [T, N] fp32 (x @ W.T + bias +
   residual); a torch reference beside it for its tests, as the other modules have.
2. Add a Format under the format's name to FORMATS, its ways in order of preference, and
   the layer's class to AnyLinear.
3. Have weight_format return that name: for a weight type of its own (as GGUF's
   BlockWeight), or for the `weights` name the model passes (CausalLM's linear_weights).
To add a way to a format: a Way in the format's list where it should rank as the default.
A way whose output is rounded below fp32 sets rounds_output (the bf16 LM head then keeps
fp32 weights: bf16_logits_stay_fp32); a layer that runs oneDNN, which compiles a kernel per
row count, sets `onednn = True` so that the runner pads a step's rows (choice.row_padding).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, partial

import torch

from minivllm.model.kernels import library
from minivllm.model.kernels.isa import native_bf16
from minivllm.model.linear.amx import AmxBf16Linear
from minivllm.model.linear.choice import ChosenLinear, KernelChoice
from minivllm.model.linear.gguf import BlockRows, BlockWeight, GGUFLinear
from minivllm.model.linear.int8 import Int8Linear
from minivllm.model.linear.onednn import Linear, onednn_usable
from minivllm.model.linear.panels import PanelLinear

AnyLinear = Linear | Int8Linear | GGUFLinear | AmxBf16Linear | PanelLinear
AnyWeight = torch.Tensor | BlockWeight | BlockRows


class Machine:
    """What runs here beside torch's own linear. Each answer is asked for only where a way
    needs it: the first loads the C kernels (building them if needed), which a layer built
    with fast=False never does."""

    @cached_property
    def amx(self) -> bool:
        """amx_gemm.c's AMX-BF16 tiles."""
        return library.amx()

    @cached_property
    def panels(self) -> bool:
        """panel_gemm.c: the kernels at AVX2 or above."""
        return library.panel_width() > 0

    @cached_property
    def bf16_pairs(self) -> bool:
        """panel_gemm.c's bf16 dot products: the kernels at AVX512-BF16 or above."""
        return self.panels and library.panel_bf16_dot()

    @cached_property
    def onednn_bf16(self) -> bool:
        """oneDNN's bf16 linear on the CPU's own bf16 dot products (not emulated)."""
        return onednn_usable(torch.empty(0, dtype=torch.bfloat16)) and native_bf16()


@dataclass(frozen=True)
class Site:
    """One linear to build. fast: whether the fast paths may run (the C kernels, oneDNN);
    head: the LM head, whose logits must not be rounded to bf16 and whose rows are the
    step's sampled ones."""

    weight: AnyWeight
    bias: torch.Tensor | None
    fast: bool
    head: bool
    machine: Machine

    @property
    def fast_cpu(self) -> bool:
        """The fast paths allowed, the weight on the CPU."""
        return self.fast and self.weight.device.type == "cpu"


@dataclass(frozen=True)
class Way:
    name: str  # as the measured choice's table and `check-kernels --gemm` name it
    runs: Callable[[Site], bool]
    build: Callable[[Site], AnyLinear]
    rounds_output: bool = False  # y rounded to bf16 (oneDNN's bf16 linear, F.linear's)


@dataclass(frozen=True)
class Format:
    ways: tuple[Way, ...]  # in order of preference
    fallback: Way | None = None  # where none of them runs


def _anywhere(site: Site) -> bool:
    return True


def _onednn_bf16_runs(site: Site) -> bool:
    # oneDNN's bf16 rounds its output to bf16: never the LM head's where AMX or the bf16
    # dot panels keep the logits fp32 at bf16 speed
    m = site.machine
    return site.fast_cpu and m.onednn_bf16 and not (site.head and (m.amx or m.bf16_pairs))


FORMATS: dict[str, Format] = {
    "float": Format((
        Way("oneDNN", lambda s: s.fast and onednn_usable(s.weight),
            lambda s: Linear(s.weight, s.bias)),
        Way("torch", _anywhere, lambda s: Linear(s.weight, s.bias, False)),
        Way("fp32 panels",
            lambda s: s.weight.dtype == torch.float32 and s.fast_cpu and s.machine.panels,
            lambda s: PanelLinear(s.weight, s.bias, "fp32")),
    )),
    "bf16": Format((
        Way("AMX bf16", lambda s: s.fast_cpu and s.machine.amx,
            lambda s: AmxBf16Linear(s.weight, s.bias)),
        Way("oneDNN bf16", _onednn_bf16_runs,
            lambda s: Linear(s.weight.to(torch.bfloat16), s.bias), rounds_output=True),
        Way("bf16 dot panels", lambda s: s.fast_cpu and s.machine.bf16_pairs,
            lambda s: PanelLinear(s.weight, s.bias, "bf16 pairs")),
        Way("bf16 panels", lambda s: s.fast_cpu and s.machine.panels,
            lambda s: PanelLinear(s.weight, s.bias)),
    ), fallback=Way("bf16", _anywhere,
                    lambda s: Linear(s.weight.to(torch.bfloat16), s.bias, s.fast),
                    rounds_output=True)),
    "int8": Format((
        Way("int8", _anywhere, lambda s: Int8Linear(s.weight, s.bias, use_kernel=s.fast)),
    )),
    "gguf": Format((
        Way("gguf", _anywhere, lambda s: GGUFLinear(s.weight, s.bias, use_kernel=s.fast)),
    )),
}


def weight_format(weight: AnyWeight, weights: str | None) -> str:
    """A GGUF file's blocks run as "gguf"; other weights as the model's `weights` ("int8",
    "bf16"), "float" where it names none."""
    if isinstance(weight, BlockWeight | BlockRows):
        return "gguf"
    return weights or "float"


def _ways_here(site: Site, fmt: str) -> list[Way]:
    entry = FORMATS[fmt]
    return [way for way in entry.ways if way.runs(site)] or [entry.fallback]


def linear_ways(weight: AnyWeight, bias: torch.Tensor | None, fast: bool,
                weights: str | None, head: bool = False, machine: Machine | None = None
                ) -> dict[str, Callable[[], AnyLinear]]:
    """name -> a builder, for each way this weight can run here (the default first).
    machine: what runs here (tests fake one)."""
    site = Site(weight, bias, fast, head, machine or Machine())
    return {way.name: partial(way.build, site)
            for way in _ways_here(site, weight_format(weight, weights))}


def build_linear(weight: AnyWeight, bias: torch.Tensor | None, fast: bool,
                 weights: str | None, choice: KernelChoice | None = None,
                 head: bool = False) -> AnyLinear | ChosenLinear:
    """The layer for this weight: weights None (the model's dtype), "int8" or "bf16" (see
    weight_format); with a choice, the ways that run here measured per row count, without
    one the default. head: the LM head (see Site)."""
    builders = linear_ways(weight, bias, fast, weights, head)
    if choice is None:
        return next(iter(builders.values()))()
    return choice.choose(builders, *weight.shape, bias is not None, head)


def bf16_logits_stay_fp32(weight: torch.Tensor, fast: bool,
                          machine: Machine | None = None) -> bool:
    """Whether a bf16 LM head returns its products unrounded (AMX tiles, panel_gemm.c, bf16
    dot panels included) whichever of its ways runs, not rounded to bf16 (oneDNN's bf16 and
    F.linear's)."""
    site = Site(weight, None, fast, True, machine or Machine())
    return not any(way.rounds_output for way in _ways_here(site, "bf16"))
