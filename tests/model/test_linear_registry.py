"""The registry that picks how a linear runs (model/linear/registry.py): each weight format
to its layer, the fast paths only where allowed and present (a faked Machine), and the
fallback where none runs. test_linear_choice.py tests the measured choice among the ways."""

from types import SimpleNamespace

import torch

from minivllm.model.kernels import gguf_blocks
from minivllm.model.linear.gguf import BlockRows, BlockWeight, GGUFLinear
from minivllm.model.linear.int8 import Int8Linear
from minivllm.model.linear.onednn import Linear
from minivllm.model.linear.registry import build_linear, linear_ways, weight_format

NOTHING = SimpleNamespace(amx=False, panels=False, bf16_pairs=False, onednn_bf16=False)
EVERYTHING = SimpleNamespace(amx=True, panels=True, bf16_pairs=True, onednn_bf16=True)


def _blocks(rows: int = 4, k: int = 32) -> BlockWeight:
    """Q8_0 blocks of zeros (scale 0: all-zero weights)."""
    row_bytes = k // gguf_blocks.BLOCK * gguf_blocks.UNIT_BYTES[gguf_blocks.Q8_0]
    return BlockWeight(gguf_blocks.Q8_0, torch.zeros(rows, row_bytes, dtype=torch.uint8))


def test_each_weight_has_its_format():
    weight = torch.randn(4, 32)
    assert weight_format(weight, None) == "float"
    assert weight_format(weight, "bf16") == "bf16"
    assert weight_format(weight, "int8") == "int8"
    assert weight_format(_blocks(), None) == "gguf"
    assert weight_format(BlockRows([_blocks(), _blocks()]), "bf16") == "gguf"  # as stored


def test_the_fast_ways_run_only_where_allowed_and_present():
    weight = torch.randn(4, 32)
    assert "fp32 panels" not in linear_ways(weight, None, True, None, machine=NOTHING)
    assert "fp32 panels" in linear_ways(weight, None, True, None, machine=EVERYTHING)
    assert list(linear_ways(weight, None, False, None, machine=EVERYTHING)) == ["torch"]
    # no bf16 way runs here: the fallback, torch's bf16 (or oneDNN's)
    assert list(linear_ways(weight, None, True, "bf16", machine=NOTHING)) == ["bf16"]
    assert list(linear_ways(_blocks(), None, True, None, machine=EVERYTHING)) == ["gguf"]
    assert list(linear_ways(weight, None, True, "int8", machine=EVERYTHING)) == ["int8"]


def test_without_a_choice_the_default_way_is_built():
    weight = torch.randn(4, 32)
    assert isinstance(build_linear(weight, None, False, None), Linear)
    assert isinstance(build_linear(weight, None, False, "int8"), Int8Linear)
    assert isinstance(build_linear(_blocks(), None, False, None), GGUFLinear)
