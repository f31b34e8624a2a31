"""GGUF Q4_K super-blocks written here for the tests: the gguf package reads Q4_K but cannot
write it. A plain quantizer (each block's range over 15 steps, its scale and minimum rounded
to 6 bits of the super-block's d and dmin), not llama.cpp's search for the best scales: the
tests need valid blocks, not the best ones."""

from __future__ import annotations

import numpy as np


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """float32 [N, K], K a multiple of 256 -> uint8 [N, K / 256 * 144], llama.cpp's layout."""
    n, k = w.shape
    blocks = w.reshape(n, k // 256, 8, 32).astype(np.float32)
    low = np.minimum(blocks.min(axis=-1), 0)  # a block's values: d * sc * q - dmin * m
    scale = (blocks.max(axis=-1) - low) / 15
    d = (scale.max(axis=-1) / 63).astype(np.float16)
    dmin = ((-low).max(axis=-1) / 63).astype(np.float16)
    sc = _six_bits(scale, d)
    m = _six_bits(-low, dmin)
    step = (d.astype(np.float32)[..., None] * sc)[..., None]
    offset = (dmin.astype(np.float32)[..., None] * m)[..., None]
    q = np.where(step > 0, np.rint((blocks + offset) / np.where(step > 0, step, 1)), 0)
    q = np.clip(q, 0, 15).astype(np.uint8).reshape(n, k // 256, 4, 2, 32)
    nibbles = q[:, :, :, 0] | (q[:, :, :, 1] << 4)  # block 2j low, block 2j + 1 high
    packed = np.zeros((n, k // 256, 12), np.uint8)
    packed[..., 0:4] = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    packed[..., 4:8] = m[..., :4] | ((m[..., 4:] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4)
    head = np.stack([d, dmin], axis=-1).view(np.uint8)
    return np.concatenate([head, packed, nibbles.reshape(n, k // 256, 128)],
                          axis=-1).reshape(n, -1)


def _six_bits(values: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """values [N, S, 8] in steps of the super-block's unit [N, S] (fp16), 0..63."""
    unit = unit.astype(np.float32)[..., None]
    steps = np.rint(values / np.where(unit > 0, unit, 1))
    return np.clip(np.where(unit > 0, steps, 0), 0, 63).astype(np.uint8)
