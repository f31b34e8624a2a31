"""`minivllm check-kernels MODEL`: run a model once through the kernels and once through
torch, and print the largest difference per decoder layer and of the logits. With --gemm,
the speed of its linears instead (check_gemm.py). A lab tool, in bench/ beside the GEMM
table's peaks (peaks.py), though a top-level command.

Both builds take the same weights, loaded once; "torch" is what MINIVLLM_DISABLE_KERNELS=1
gives (no C kernels, no oneDNN linears). The prompt runs as a serving step would: a prefill
through the paged KV cache (in chunks with --chunk-size), then greedy decode steps fed the
torch path's tokens, so that both see the same inputs at every step. A layer agrees when
its largest absolute difference is within rtol of its largest absolute value, or of 1 if
that is smaller (the residual stream grows layer by layer: one absolute bound fits no
model). The first line says which ISA level's kernels run (MINIVLLM_ISA=<level> checks a
lower one).
"""

from __future__ import annotations

import argparse
import os
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from minivllm.bench.check_gemm import DEFAULT_ROWS, run_gemm

# Relative tolerance per dtype: fp32 sums in another order, ~1e-5 of the values here; a
# bf16 / fp16 result rounds to 3 significant digits, and the paths round at other places.
DEFAULT_RTOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}
BLOCK_SIZE = 16


@dataclass
class Row:
    name: str  # "layer 3", "logits"
    max_diff: float = 0.0  # largest |kernels - torch| over every token of every step
    max_ref: float = 0.0  # largest |torch| there

    def update(self, got: torch.Tensor, ref: torch.Tensor) -> None:
        got, ref = got.float(), ref.float()
        self.max_diff = max(self.max_diff, (got - ref).abs().max().item())
        self.max_ref = max(self.max_ref, ref.abs().max().item())

    def ok(self, rtol: float) -> bool:
        # NaN fails: a comparison with it is False
        return self.max_diff <= rtol * max(self.max_ref, 1.0)


@dataclass
class Report:
    rtol: float
    dtype: torch.dtype
    num_prompt_tokens: int
    rows: list[Row] = field(default_factory=list)  # the layers in order, then the logits
    # (kernels, torch): the argmax of the last token's logits, per step from the last prefill
    greedy_tokens: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))

    @property
    def first_failure(self) -> Row | None:
        return next((row for row in self.rows if not row.ok(self.rtol)), None)

    def format(self) -> str:
        lines = [f"{self.num_prompt_tokens} prompt tokens, {len(self.greedy_tokens[1]) - 1} "
                 f"decode steps, {str(self.dtype).removeprefix('torch.')}; "
                 f"kernels vs torch, tolerance {self.rtol:g} of max |torch|",
                 f"{'':10} {'max |diff|':>12} {'max |torch|':>12} {'relative':>10}"]
        for row in self.rows:
            rel = row.max_diff / max(row.max_ref, 1.0)
            mark = "" if row.ok(self.rtol) else "  <- differs"
            lines.append(f"{row.name:10} {row.max_diff:12.3e} {row.max_ref:12.3e} "
                         f"{rel:10.2e}{mark}")
        got, ref = self.greedy_tokens
        lines.append("greedy tokens: " + ("identical" if got == ref else
                                          f"kernels {got}, torch {ref}"))
        failure = self.first_failure
        lines.append("OK: the kernels match torch" if failure is None else
                     f"FAIL: the kernels differ from torch from {failure.name} on")
        return "\n".join(lines)


@contextmanager
def _kernels(on: bool):
    """MINIVLLM_DISABLE_KERNELS as the model is built (it decides there, once)."""
    saved = os.environ.pop("MINIVLLM_DISABLE_KERNELS", None)
    if not on:
        os.environ["MINIVLLM_DISABLE_KERNELS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("MINIVLLM_DISABLE_KERNELS", None)
        if saved is not None:
            os.environ["MINIVLLM_DISABLE_KERNELS"] = saved


class _Path:
    """One build of the model with its own KV cache, recording each layer's output."""

    def __init__(self, hf_config, weights: dict, kernels_on: bool, num_tokens: int) -> None:
        from minivllm.model.kernels import library
        from minivllm.model.models import build_model, head_dim

        dtype = next(iter(weights.values())).dtype
        with _kernels(kernels_on):
            self.model = build_model(hf_config, dict(weights))  # it pops what it takes
            self.use_kernel = library.available(torch.device("cpu"), dtype)
        num_blocks = -(-num_tokens // BLOCK_SIZE)
        shape = (hf_config.num_hidden_layers, num_blocks, BLOCK_SIZE,
                 hf_config.num_key_value_heads, head_dim(hf_config))
        self.kv_caches = (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
        self.block_table = torch.arange(num_blocks)[None]  # one request, blocks in order
        self.outputs: list[torch.Tensor] = []
        for layer in self.model.layers:
            layer.register_forward_hook(lambda _m, _i, out: self.outputs.append(out.clone()))

    def step(self, token_ids: list[int], start: int) -> list[torch.Tensor]:
        """The layers' outputs and the logits of tokens start .. start + n of the request."""
        from minivllm.model.attention import AttentionMetadata

        n = len(token_ids)
        positions = torch.arange(start, start + n)
        meta = AttentionMetadata(
            slot_mapping=positions, block_table=self.block_table,
            seq_lens=torch.tensor([start + n]), query_start_loc=torch.tensor([0, n]),
            num_decodes=int(n == 1), num_tokens=n, block_size=BLOCK_SIZE,
            use_kernel=self.use_kernel)
        self.outputs = []
        hidden = self.model(torch.tensor(token_ids), positions, self.kv_caches, meta)
        return [*self.outputs, self.model.compute_logits(hidden)]


def kernels_unavailable_reason() -> str | None:
    from minivllm.model.kernels import library

    if not library.enabled():
        return "MINIVLLM_DISABLE_KERNELS is set: unset it to check the kernels"
    if not library.available(torch.device("cpu"), torch.float32):
        return "the C kernels cannot be built or loaded here (see the warning above)"
    return None


def check_kernels(hf_config, weights: dict[str, torch.Tensor], prompt_token_ids: list[int],
                  decode_steps: int = 4, chunk_size: int = 0,
                  rtol: float | None = None) -> Report:
    """Run the prompt through both builds of the model; weights already in the dtype wanted."""
    dtype = next(iter(weights.values())).dtype
    total = len(prompt_token_ids) + decode_steps
    fast = _Path(hf_config, weights, True, total)
    slow = _Path(hf_config, weights, False, total)
    report = Report(DEFAULT_RTOL.get(dtype, 1e-4) if rtol is None else rtol, dtype,
                    len(prompt_token_ids))
    report.rows = [Row(f"layer {i}") for i in range(hf_config.num_hidden_layers)]
    report.rows.append(Row("logits"))
    chunk = chunk_size or len(prompt_token_ids)
    steps = [prompt_token_ids[i:i + chunk] for i in range(0, len(prompt_token_ids), chunk)]
    start = 0
    for i in range(len(steps) + decode_steps):
        if i >= len(steps):  # a decode step: the torch path's greedy token, for both
            steps.append(report.greedy_tokens[1][-1:])
        got, ref = fast.step(steps[i], start), slow.step(steps[i], start)
        for row, a, b in zip(report.rows, got, ref):
            row.update(a, b)
        start += len(steps[i])
        if start >= len(prompt_token_ids):  # the last prompt chunk and decodes sample
            report.greedy_tokens[0].append(int(got[-1][-1].argmax()))
            report.greedy_tokens[1].append(int(ref[-1][-1].argmax()))
    return report


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "check-kernels", help="compare a model's outputs through the kernels and through "
                              "torch, per layer (exit status 1 if they differ)")
    parser.add_argument("model", help="model directory, minivllm-demo, a .gguf file or hub id")
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default="The capital of France is",
                        help="prompt text (default: %(default)r)")
    prompt.add_argument("--prompt-token-ids", type=int, nargs="+", help="prompt token ids")
    parser.add_argument("--dtype", default="auto",
                        choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--decode-steps", type=int, default=4,
                        help="greedy decode steps after the prefill (default: 4)")
    parser.add_argument("--chunk-size", type=int, default=0,
                        help="prefill the prompt in chunks of this many tokens (default: "
                             "the whole prompt in one step)")
    parser.add_argument("--gemm", action="store_true",
                        help="instead: time each of the model's linear shapes every way this "
                             "CPU runs it, per row count (GFLOP/s, the way --kernel-choice "
                             "measure runs, its fraction of the roof)")
    parser.add_argument("--rows", type=int, nargs="+", default=list(DEFAULT_ROWS),
                        help="with --gemm: the row counts (default: %(default)s)")
    parser.add_argument("--quantization", choices=["none", "int8"], default="none",
                        help="with --gemm: int8 times the W8A8 linears")
    parser.add_argument("--rtol", type=float, default=None,
                        help="tolerance relative to the largest value (default: 1e-4 for "
                             "float32, 3e-2 for bfloat16, 1e-2 for float16)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from transformers import AutoConfig, AutoTokenizer

    from minivllm.model.kernels import library
    from minivllm.model.loader import load_state_dict, resolve_dtype, resolve_model_path

    reason = kernels_unavailable_reason()
    if reason:
        raise SystemExit(f"cannot check the kernels: {reason}")
    print(f"C kernels: {library.isa_summary()}")  # MINIVLLM_ISA=<level> checks another level
    path = resolve_model_path(args.model)
    hf_config = AutoConfig.from_pretrained(path)
    if args.gemm:
        return run_gemm(args, hf_config)
    ids = args.prompt_token_ids or AutoTokenizer.from_pretrained(path)(args.prompt).input_ids
    if not ids:
        raise SystemExit("the prompt has no tokens")
    dtype = resolve_dtype(args.dtype, hf_config)
    weights = {k: v.to(dtype) for k, v in load_state_dict(path).items()}
    report = check_kernels(hf_config, weights, ids, args.decode_steps, args.chunk_size,
                           args.rtol)
    print(report.format())
    return 0 if report.first_failure is None else 1
