"""The repack cache (linear/repack_cache.py): a GGUF file's blocks repacked at the first start
are kept beside its model directory, a restart maps them (nothing repacked, the fused rows
never joined) and generates what the first start did; a damaged file is deleted and the
weights repacked. On test_gguf_blocks' tiny Llama of mixed block types."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.model.kernels import gguf_ops, library
from minivllm.model.kernels.gguf_blocks import Q6_K, Q8_0
from minivllm.model.linear import gguf as linear_gguf
from minivllm.model.linear.gguf import cat_rows
from minivllm.model.linear.repack_cache import RepackCache, checksum, repack
from minivllm.model.loader import resolve_model_path
from tests.model.test_gguf_blocks import blocks_gguf  # noqa: F401
from tests.model.test_gguf_kernel import block_weight

PROMPT = [{"prompt_token_ids": [1, 40, 7, 300, 12, 99]}]
PARAMS = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE", str(tmp_path / "cache"))
    if not library.gguf_repacked():
        pytest.skip("this CPU's kernels do not repack GGUF blocks (below AVX2)")


@pytest.fixture
def repacks(monkeypatch) -> list[int]:
    """The GGUF types repacked by gguf_ops.gguf_repack, call by call."""
    calls, repack = [], gguf_ops.gguf_repack

    def counted(blocks, qtype, k, out=None):
        calls.append(qtype)
        return repack(blocks, qtype, k, out)

    monkeypatch.setattr(gguf_ops, "gguf_repack", counted)
    return calls


def start(path, caplog) -> list[int]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="minivllm.model.linear.repack_cache"):
        llm = LLM(str(path), dtype="float32", block_size=4, num_kv_blocks=32)
    return list(llm.generate(PROMPT, PARAMS)[0].outputs[0].token_ids)


def cache_file(path):
    return resolve_model_path(str(path)) / RepackCache.file_name()


def test_a_restart_maps_the_repacked_weights(blocks_gguf, caplog, repacks, monkeypatch):  # noqa: F811
    joined, blocks = [], linear_gguf.BlockWeight.blocks

    def joining(weight):
        if len(weight._parts) > 1:
            joined.append(weight.source)
        return blocks.fget(weight)

    monkeypatch.setattr(linear_gguf.BlockWeight, "blocks", property(joining))
    first = start(blocks_gguf, caplog)
    assert repacks and cache_file(blocks_gguf).exists()
    (written,) = re.findall(r"repack cache: (\d+) tensors \(.*\) written to", caplog.text)
    repacks.clear()
    assert start(blocks_gguf, caplog) == first
    assert repacks == []  # every repacked weight came from the file
    assert joined == []  # and no fused q/k/v or gate/up had its blocks joined
    assert f"repack cache: {written} tensors mapped" in caplog.text


def test_a_damaged_file_is_deleted_and_the_weights_repacked(blocks_gguf, caplog, repacks):  # noqa: F811
    first = start(blocks_gguf, caplog)
    path = cache_file(blocks_gguf)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the last tensor's last byte: only its checksum can tell
    path.write_bytes(bytes(data))
    repacks.clear()
    assert start(blocks_gguf, caplog) == first
    assert "is damaged" in caplog.text and "fails its checksum" in caplog.text
    assert repacks  # repacked again, and written again: the next start maps them
    repacks.clear()
    assert start(blocks_gguf, caplog) == first and repacks == []


def test_the_checksum_sees_a_flipped_bit_anywhere(tmp_path):
    data = torch.arange(37, dtype=torch.uint8)  # 4 words and a 5-byte tail
    base = checksum(data)
    for at in (0, 9, 31, 32, 36):
        flipped = data.clone()
        flipped[at] ^= 0x40
        assert checksum(flipped) != base, at


@pytest.mark.parametrize("qtype", [Q8_0, Q6_K], ids=["Q8_0", "Q6_K"])
@pytest.mark.parametrize("rows", [(32, 40), (48, 16, 5), (20, 12)])
def test_a_join_repacks_range_by_range_as_the_joined_blocks(qtype, rows):
    """Whole panels (16 rows) before the last range: each range repacked into its place of
    one buffer, never joined; else (20 + 12) the blocks joined first. The same bytes."""
    k = 256
    parts = [block_weight(n, k, qtype, seed=n)[0] for n in rows]
    joined = cat_rows(parts)
    expected = gguf_ops.gguf_repack(torch.cat([p.blocks for p in parts]), qtype, k)
    assert torch.equal(repack(joined, k), expected)
    assert len(joined._parts) == (1 if rows == (20, 12) else len(rows))  # joined, or not


def test_writing_the_file_deletes_another_librarys(blocks_gguf, caplog):  # noqa: F811
    stale = cache_file(blocks_gguf).with_name("repacked-minivllm-kernels-avx2-0000.bin")
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"an older layout")
    start(blocks_gguf, caplog)
    assert not stale.exists() and cache_file(blocks_gguf).exists()
