"""LoRA in the simulator: requests spread over adapters (`--num-loras`), the scheduler's
max_loras bounding the adapters of a step, and the roofline's LoRA term (each LoRA token's
extra flops, each adapter's weights read once a step)."""

from __future__ import annotations

from minivllm.bench.workload import Trace, TraceEntry
from minivllm.cli import main
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.step_batch import StepBatch
from minivllm.sim.cost_model import CostModel
from minivllm.sim.roofline import roofline_from_preset
from minivllm.sim.simulator import Simulator


class LoRACost(CostModel):
    """Steps cost more with each adapter in them; records the adapters per step."""

    name = "lora-fake"

    def __init__(self) -> None:
        self.loras_per_step: list[int] = []

    def step_time(self, b: StepBatch) -> float:
        self.loras_per_step.append(b.num_loras)
        return 0.01 + 0.002 * b.num_loras + 0.0001 * b.num_lora_tokens


def trace(n: int = 24) -> Trace:
    return Trace("lora", [TraceEntry(0.0, i, 16, 8) for i in range(n)])


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{"num_blocks": 400, "block_size": 4, "max_num_batched_tokens": 256,
                              "max_model_len": 128, **kw})


def test_max_loras_bounds_every_step_and_all_requests_finish():
    for max_loras in (1, 2, 4):
        cost = LoRACost()
        result = Simulator(config(max_loras=max_loras), "fcfs", cost, num_loras=4).run(trace())
        assert all(r.success for r in result.results)
        assert max(cost.loras_per_step) == max_loras


def test_the_base_model_runs_no_lora_term():
    cost = LoRACost()
    Simulator(config(), "fcfs", cost).run(trace())
    assert set(cost.loras_per_step) == {0}


def test_the_roofline_prices_lora_tokens_and_adapters():
    model = roofline_from_preset("rtx4090-qwen2.5-7b", lora_rank=16)
    base = StepBatch(num_decode_seqs=64, decode_context=64 * 512)
    one = StepBatch(num_decode_seqs=64, decode_context=64 * 512, num_lora_tokens=64,
                    num_loras=1)
    eight = StepBatch(num_decode_seqs=64, decode_context=64 * 512, num_lora_tokens=64,
                      num_loras=8)
    assert model.step_time(base) < model.step_time(one) < model.step_time(eight)
    # rank 16 on Qwen2.5-7B: ~40M weights an adapter, against 6.5B: a few percent a step
    assert model.step_time(eight) < 1.5 * model.step_time(base)


def test_the_cli_takes_num_loras_and_refuses_it_with_a_profile(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["sim", "serve", "--workload", "seed-low", "--num-prompts", "12",
                 "--num-loras", "4", "--max-loras", "2", "--output", str(out),
                 "--disable-tqdm"]) == 0
    capsys.readouterr()
    assert main(["sim", "serve", "--cost-model", "profile:/nowhere.json", "--num-loras", "2",
                 "--workload", "seed-low", "--num-prompts", "2"]) == 2
    assert "only roofline cost models price LoRA" in capsys.readouterr().err
