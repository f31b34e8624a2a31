"""The batched LoRA delta (every way: the C kernels' segment GEMM, lora_sgmv.c; without
them stacked bmm for even row counts, a matmul pair per adapter otherwise) against the
plain per-row sum, on random rows and adapters of different ranks, one of which does not
target every linear; and the kernel at SmolLM2's and Qwen2.5-0.5B's shapes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from minivllm.lora.manager import LoRAManager
from minivllm.lora.request import LoRARequest
from minivllm.lora.weights import LoRAPair

IN, OUT = 24, 40


class FakeWeights:
    """o_proj (one slot of OUT), and qkv as two slots of OUT / 2 (the second left alone
    unless `both_slots`)."""

    def __init__(self, rank: int, targets_qkv: bool, seed: int, both_slots: bool = False
                 ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.pairs = {(0, "o_proj"): LoRAPair(torch.randn(rank, IN, generator=g),
                                              [torch.randn(OUT, rank, generator=g)], [0])}
        if targets_qkv:
            a = torch.randn(2 * rank, IN, generator=g)
            second = torch.randn(OUT // 2, rank, generator=g) if both_slots else None
            if second is None:
                a[rank:] = 0
            self.pairs[(0, "qkv")] = LoRAPair(a, [torch.randn(OUT // 2, rank, generator=g),
                                                  second], [0, OUT // 2])

    def to_bf16(self) -> FakeWeights:
        """The adapter as a --dtype bfloat16 engine holds it for the kernel."""
        for pair in self.pairs.values():
            pair.a = pair.a.bfloat16()
            pair.b = [None if b is None else b.bfloat16() for b in pair.b]
        return self

    def delta(self, name: str, x: torch.Tensor) -> torch.Tensor:
        pair = self.pairs[(0, name)]
        out = torch.zeros(len(x), OUT)
        for slot, b in enumerate(pair.b):
            if b is not None:
                r = pair.rank
                out[:, pair.offsets[slot]:pair.offsets[slot] + b.shape[0]] = (
                    x @ pair.a[slot * r:(slot + 1) * r].float().t() @ b.float().t())
        return out


def manager_with(adapters: dict[int, FakeWeights], use_kernel: bool = False):
    weight = torch.randn(OUT, IN)
    base = lambda x, residual=None: x @ weight.t() + (0 if residual is None else residual)  # noqa: E731
    layer = SimpleNamespace(self_attn=SimpleNamespace(qkv=base), o_proj=base,
                            mlp=SimpleNamespace(gate_up=base, down=base))
    manager = LoRAManager(SimpleNamespace(layers=[layer]), None, 16, 8, torch.float32,
                          torch.device("cpu"))
    if use_kernel and not manager.use_kernel:
        pytest.fail("the C kernels are not available: the kernel way cannot be tested")
    manager.use_kernel = use_kernel
    for i, w in adapters.items():
        manager.adapters[i] = (LoRARequest(f"a{i}", i, "/x"), w)
    return manager, layer, base


@pytest.mark.parametrize("way", ["torch", "kernel", "kernel-bf16"])
@pytest.mark.parametrize("both_slots", [False, True])  # True: every slot of qkv targeted
@pytest.mark.parametrize("counts", [
    [1, 1, 1, 1, 1, 1],  # decodes of three adapters and the base: batched, no padding
    [1, 1, 2, 1, 1, 1],  # nearly even: batched with padding
    [9, 1, 1, 1],  # one long prefill: a matmul pair per adapter
    [3, 3],  # one adapter and the base
    [5],  # one adapter alone
])
def test_every_way_equals_the_per_row_sum(counts, both_slots, way):
    rng = np.random.default_rng(len(counts) + sum(counts))
    adapters = {1: FakeWeights(4, True, 1), 2: FakeWeights(8, False, 2),
                3: FakeWeights(2, True, 3, both_slots)}
    if way == "kernel-bf16":
        adapters = {i: w.to_bf16() for i, w in adapters.items()}
    manager, layer, base = manager_with(adapters, way != "torch")
    lora_ids = [int(rng.integers(0, 4)) for _ in counts]
    if len(counts) == 1:
        lora_ids = [1]
    elif len(counts) == 6:  # the batched way with adapters 1 and 3 (and 2, and the base)
        lora_ids = [1, 3, 2, 0, 3, 1]
    query_start_loc = np.concatenate([[0], np.cumsum(counts)])
    x = torch.randn(int(query_start_loc[-1]), IN)
    manager.set_step(lora_ids, query_start_loc)
    for name, linear in (("qkv", layer.self_attn.qkv), ("o_proj", layer.o_proj)):
        want = base(x).clone()
        for i, lora_id in enumerate(lora_ids):
            if lora_id and (0, name) in adapters[lora_id].pairs:
                rows = slice(query_start_loc[i], query_start_loc[i + 1])
                want[rows] += adapters[lora_id].delta(name, x[rows])
        torch.testing.assert_close(linear(x), want, rtol=1e-5, atol=1e-4)


def test_the_ways_are_both_taken():
    manager, _, _ = manager_with({1: FakeWeights(4, True, 1), 2: FakeWeights(8, True, 2)},
                                 use_kernel=True)
    manager.set_step([1, 2, 1, 2], np.array([0, 1, 2, 3, 4]))
    rows, seg = manager.step.segments
    assert rows.tolist() == [0, 2, 1, 3] and seg.tolist() == [0, 2, 4]
    assert manager.step.gather is None
    manager.use_kernel = False
    manager.set_step([1, 2, 1, 2], np.array([0, 1, 2, 3, 4]))
    assert manager.step.gather is not None and not manager.step.groups
    manager.set_step([1, 2], np.array([0, 9, 10]))
    assert manager.step.gather is None and len(manager.step.groups) == 2


@pytest.mark.parametrize("weights", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(576, 960, 3), (576, 3072, 2), (1536, 576, 1),
                                   (896, 9728, 2), (4864, 896, 1), (100, 37, 3)],
                         ids=lambda s: f"{s[0]}x{s[1]}x{s[2]}")
@pytest.mark.parametrize("rows", [1, 15, 17, 64])
def test_kernel_at_real_shapes(shape, rows, weights):
    check_kernel(shape, rows, weights)


def check_kernel(shape: tuple[int, int, int], rows: int, weights: torch.dtype) -> None:
    """lora_sgmv.c alone at SmolLM2's and Qwen2.5-0.5B's fused shapes (in, out, slots) and
    odd ones, 8 adapters of rank 16 over rows in a random order, some rows of none, against
    the product with the whole block-diagonal B; bf16 weights against the same product of
    their fp32 values (the kernel widens them exactly)."""
    from minivllm.model.kernels import library, lora_ops

    if not library.available(torch.device("cpu"), torch.float32):
        pytest.fail("the C kernels are not available")
    k, n, slots = shape
    g = torch.Generator().manual_seed(rows * k + n)
    bounds = [n * t // slots for t in range(slots + 1)]  # (100, 37, 3): slots of 12, 12, 13
    a = torch.randn(8, 16 * slots, k, generator=g).to(weights)
    b = (torch.randn(8, 16, n, generator=g) * 0.1).to(weights)
    block_diagonal = torch.zeros(8, 16 * slots, n)
    for t in range(slots):
        columns = slice(bounds[t], bounds[t + 1])
        block_diagonal[:, 16 * t:16 * (t + 1), columns] = b[:, :, columns].float()
    x, y = torch.randn(rows, k, generator=g), torch.randn(rows, n, generator=g)
    owner = torch.randint(-1, 8, (rows,), generator=g)  # -1: the base model's row
    order = [i for s in range(8) for i in torch.nonzero(owner == s).flatten().tolist()]
    counts = [int((owner == s).sum()) for s in range(8)]
    want = y.clone()
    for i in order:
        want[i] += (x[i] @ a[owner[i]].float().t()) @ block_diagonal[owner[i]]
    lora_ops.lora_sgmv(x, y, torch.tensor(order, dtype=torch.int64),
                       torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int64),
                       a, b, torch.tensor(bounds, dtype=torch.int64))
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-3)
