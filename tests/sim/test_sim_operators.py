"""The operator cost model (sim/operators_model.py) and its calibration
(sim/operators_calibrate.py): interpolation, a step priced as the sum of its operators, the
JSON round trip and the refusal of another machine, and a quick calibration on a tiny model
that the simulator then runs with."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from minivllm.core.step_batch import StepBatch, step_batch
from minivllm.sim.cost_model_spec import load_cost_model
from minivllm.sim.operators_model import (
    LINEARS,
    OperatorCostModel,
    interpolate,
    interpolate_2d,
    machine_identity,
)
from minivllm.sim.step_kinds import relative_errors, step_kind


def synthetic(pads_rows: bool | list[bool] = False, rows=(1, 2, 4), linear=(1.0, 2.0, 4.0)) -> OperatorCostModel:
    tables = {
        "rows": list(rows),
        "linears": {name: {"k": 8, "n": 8, "weight": "Linear", "seconds": list(linear)}
                    for name in LINEARS},
        "lm_head": {"k": 8, "seconds": [10.0, 20.0, 40.0]},
        "sampler": {"rows": [1, 2, 4], "seconds": [1.0, 1.5, 2.5]},
        "prefill_attention": {"query_tokens": [2, 4], "context": [0, 8],
                              "seconds": [[1.0, 3.0], [2.0, 6.0]]},
        "decode_attention": {"batch": [1, 2], "context": [1, 9],
                             "seconds": [[1.0, 2.0], [3.0, 5.0]]},
        "swap_seconds_per_token": 0.5,
    }
    machine = {**machine_identity(), "num_threads": 1, "dtype": "float32",
               "quantization": None, "kv_cache_dtype": "auto"}
    engine = {"num_layers": 2, "pads_rows": pads_rows, "num_kv_blocks": 100, "block_size": 16,
              "max_model_len": 256, "kv_bytes_per_token": 64, "model": "synthetic"}
    return OperatorCostModel(tables, {"step": 100.0, "decode_seq": 10.0, "prefill_seq": 20.0,
                                      "prefill_token": 1.0}, machine, engine)


def test_interpolation_is_piecewise_linear_and_extends_the_end_segments():
    xs, ys = [1, 2, 4], [1.0, 2.0, 6.0]
    assert [interpolate(x, xs, ys) for x in xs] == ys
    assert interpolate(3, xs, ys) == pytest.approx(4.0)
    assert interpolate(8, xs, ys) == pytest.approx(14.0)  # slope 2 beyond the grid
    assert interpolate(0, [1, 2], [1.0, 3.0]) == 0.0  # extended below 0: clamped
    assert interpolate(5, [4], [7.0]) == 7.0
    table = [[1.0, 3.0], [2.0, 6.0]]  # at x 2, 4 and y 0, 8
    assert interpolate_2d(3, 4, [2, 4], [0, 8], table) == pytest.approx(3.0)
    assert interpolate_2d(4, 8, [2, 4], [0, 8], table) == pytest.approx(6.0)


def test_a_step_costs_the_sum_of_its_operators():
    b = StepBatch(num_swap_tokens=16, num_sampled_seqs=2)
    b.add(2, 4)  # a prefill chunk of 2 after 4 cached tokens (it ends its prompt)
    b.add(1, 4)  # a decode reading 5 tokens
    assert b.prefill_chunks == [(2, 4)]
    cost = synthetic()
    # per layer: four linears at 3 rows (3 each) + prefill (2, 4) 2 + decode (1, 5) 1.5
    # LM head at 2 rows 20, sampler 1.5, swap 16 x 0.5, overhead 100 + a decode 10 + a
    # prefill chunk 20 + its 2 tokens x 1
    assert cost.step_time(b) == pytest.approx(2 * (12 + 2 + 1.5) + 20 + 1.5 + 8 + 132)
    # Without chunk detail, the prefill tokens are spread evenly over the chunks.
    aggregate = StepBatch(num_prefill_seqs=2, num_prefill_tokens=8, prefill_context=0)
    assert cost.attention_time(aggregate) == pytest.approx(2 * 2.0)
    # No sampled rows, no LM head nor sampler.
    assert cost.sampling_time(StepBatch(num_prefill_seqs=1, num_prefill_tokens=4)) == 0


def test_linears_are_priced_at_the_padded_rows_where_the_engine_pads():
    rows = (16, 32, 64)
    padded = synthetic(pads_rows=True, rows=rows, linear=rows)
    exact = synthetic(pads_rows=False, rows=rows, linear=rows)
    assert padded.linears_time(20) == pytest.approx(4 * 32)
    assert exact.linears_time(20) == pytest.approx(4 * 20)
    # A profile of the buckets (the engine pads only where a oneDNN way runs): 33-64 here.
    top_only = synthetic(pads_rows=[False] * 6 + [True], rows=rows, linear=rows)
    assert top_only.linears_time(20) == pytest.approx(4 * 20)
    assert top_only.linears_time(40) == pytest.approx(4 * 48)


def test_operator_tables_round_trip_and_refuse_another_machine(tmp_path):
    path = tmp_path / "operators.json"
    cost = synthetic()
    cost.save(path)
    loaded = OperatorCostModel.load(path, num_threads=1, kv_cache_dtype="auto")
    b = StepBatch(num_decode_seqs=2, decode_context=10, num_sampled_seqs=2)
    assert loaded.step_time(b) == pytest.approx(cost.step_time(b))
    assert loaded.name == f"operators:{path}"
    assert loaded.num_kv_blocks(16) == 100 and loaded.max_model_len() == 256
    with pytest.raises(ValueError, match=r"num_threads 1 \(here 4\)"):
        OperatorCostModel.load(path, num_threads=4)
    with pytest.raises(ValueError, match="kv_cache_dtype 'auto'"):
        load_cost_model(f"operators:{path}", kv_cache_dtype="int8")
    doc = json.loads(path.read_text())
    doc["machine"]["cpu"] = "Another CPU, family 25 (avx2)"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="cpu 'Another CPU"):
        OperatorCostModel.load(path)
    del doc["overhead"]["decode_seq"]
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="without overhead.decode_seq"):
        OperatorCostModel.load(path)
    path.write_text(json.dumps({"kind": "profile"}))
    with pytest.raises(ValueError, match="not operator tables"):
        OperatorCostModel.load(path)


def test_step_batch_counts_the_sampled_rows():
    def request(computed, total):
        return SimpleNamespace(num_computed_tokens=computed, num_tokens=total,
                               core_request=SimpleNamespace(lora_int_id=0))

    out = SimpleNamespace(num_scheduled_tokens={"a": 8, "b": 8, "c": 1}, swap_in=[],
                          swap_out=[])
    # a: a middle chunk of a 32-token prompt; b: its last chunk; c: a decode
    b = step_batch(out, {"a": request(8, 32), "b": request(24, 32), "c": request(40, 41)}, 16)
    assert b.num_sampled_seqs == 2
    assert b.prefill_chunks == [(8, 8), (8, 24)]


def test_errors_are_reported_per_step_kind():
    decode = StepBatch(num_decode_seqs=2)
    prefill = StepBatch(num_prefill_seqs=1, num_prefill_tokens=8)
    mixed = StepBatch(num_prefill_seqs=1, num_prefill_tokens=8, num_decode_seqs=1)
    assert [step_kind(b) for b in (decode, prefill, mixed)] == [
        "decode-only", "prefill-only", "mixed"]
    errors = relative_errors([(decode, 1.0, 1.1), (decode, 1.0, 1.3), (prefill, 2.0, 1.0)])
    assert set(errors) == {"all", "decode-only", "prefill-only"}
    assert errors["decode-only"]["median"] == pytest.approx(0.2)
    assert errors["prefill-only"] == {"n": 1, "median": 0.5, "p90": 0.5, "bias": -0.5}
    # the signed median: decodes predicted 10% and 30% slow, the prefill 50% fast
    assert errors["decode-only"]["bias"] == pytest.approx(0.2)
    assert errors["all"]["bias"] == pytest.approx(0.1)


def test_the_overhead_fit_recovers_a_known_overhead():
    from minivllm.sim.operators_calibrate import fit_overhead

    cost = synthetic()
    true = {"step": 50.0, "decode_seq": 4.0, "prefill_seq": 6.0, "prefill_token": 0.5}
    steps = []
    for prefills, tokens, decodes in ((0, 0, 1), (0, 0, 4), (1, 40, 1), (1, 8, 7), (2, 100, 1),
                                      (2, 30, 5)):
        b = StepBatch(num_prefill_seqs=prefills, num_prefill_tokens=tokens,
                      num_decode_seqs=decodes, decode_context=5 * decodes)
        steps.append((b, cost.operators_time(b) + true["step"] + true["decode_seq"] * decodes
                      + true["prefill_seq"] * prefills + true["prefill_token"] * tokens))
    assert fit_overhead(cost, steps) == pytest.approx(true)


def test_what_the_tables_miss_in_prefills_is_not_charged_to_every_decode():
    """Prefill steps cost more than the tables and the overhead's terms can say (here a
    quadratic in the tokens): the decode-only steps still get their own overhead back."""
    from minivllm.sim.operators_calibrate import fit_overhead

    cost = synthetic()
    steps = []
    for prefills, tokens, decodes in ((0, 0, 1), (0, 0, 2), (0, 0, 4), (0, 0, 8), (1, 40, 0),
                                      (1, 200, 1), (2, 100, 0), (1, 400, 2)):
        b = StepBatch(num_prefill_seqs=prefills, num_prefill_tokens=tokens,
                      num_decode_seqs=decodes, decode_context=5 * decodes)
        steps.append((b, cost.operators_time(b) + 50.0 + 4.0 * decodes + 0.002 * tokens ** 2))
    fitted = fit_overhead(cost, steps)
    assert fitted["step"] == pytest.approx(50.0) and fitted["decode_seq"] == pytest.approx(4.0)
    assert fitted["prefill_token"] > 0


def test_calibrate_operators_writes_tables_the_simulator_runs_with(tiny_llama, tmp_path):
    from minivllm.cli import main

    path = tmp_path / "operators.json"
    assert main(["sim", "calibrate", "--operators", "--model", str(tiny_llama), "--quick",
                 "--num-threads", "1", "--output", str(path)]) == 0
    cost = OperatorCostModel.load(path, num_threads=1)
    tables = cost.tables
    assert tables["rows"][0] == 1 and len(tables["linears"]["qkv"]["seconds"]) == len(
        tables["rows"])
    assert all(s > 0 for name in LINEARS for s in tables["linears"][name]["seconds"])
    assert all(s > 0 for row in tables["decode_attention"]["seconds"] for s in row)
    assert tables["decode_probe_seconds"] > 0  # sim_fidelity --host-check's reference
    assert cost.engine["num_layers"] >= 1 and cost.machine["num_threads"] == 1
    assert cost.fit_error["all"]["n"] > 20 and "decode-only" in cost.fit_error
    decode = StepBatch(num_decode_seqs=4, decode_context=100, num_sampled_seqs=4)
    assert cost.step_time(decode) > cost.operators_time(decode) > 0
    assert main(["sim", "serve", "--cost-model", f"operators:{path}", "--workload", "seed-low",
                 "--num-prompts", "6", "--output", str(tmp_path / "run"), "--disable-tqdm"]) == 0
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["meta"]["simulated"] == f"simulated, operators:{path}"
    assert run["meta"]["scheduler"]["num_blocks"] == cost.engine["num_kv_blocks"]


def test_an_overhead_the_tables_already_exceed_fits_to_zero():
    """Decode steps faster than their operators' tables: every decode term would be
    negative, so both are 0 (not a crash), and the prefill terms are still fitted."""
    from minivllm.sim.operators_calibrate import fit_overhead

    cost = synthetic()
    steps = []
    for prefills, tokens, decodes in ((0, 0, 1), (0, 0, 4), (1, 40, 0), (2, 100, 1)):
        b = StepBatch(num_prefill_seqs=prefills, num_prefill_tokens=tokens,
                      num_decode_seqs=decodes, decode_context=5 * decodes)
        extra = 0.5 * tokens if prefills else -0.5 * cost.operators_time(b)
        steps.append((b, cost.operators_time(b) + extra))
    fitted = fit_overhead(cost, steps)
    assert fitted["step"] == fitted["decode_seq"] == 0.0
    assert fitted["prefill_token"] > 0


def test_the_rows_grid_brackets_every_block_of_rows():
    """Kernels work in blocks of rows (a call's time steps up just past a block): the grid
    holds each block's end and the count after it, so interpolation keeps the step."""
    from minivllm.sim.operators_calibrate import rows_grid

    grid = rows_grid(512)
    assert {16, 17, 48, 49, 64, 65, 128, 129, 448, 449} <= set(grid) and grid[-1] == 512
    assert grid == sorted(set(grid))
    assert rows_grid(2048)[-3:] == [513, 1024, 2048]
    assert rows_grid(20) == [1, 2, 4, 8, 16, 17, 32]  # ends at the padded count


def test_calibration_spreads_each_points_timings_over_the_whole_calibration():
    """A host whose speed moves for seconds at a time must not price one point in its slow
    spell: each pass times every point once, so a spell as long as one point's repeats
    (here the first five calls, slow) moves no point's median."""
    from minivllm.sim.operators_calibrate import interleaved_medians

    calls: list[int] = []

    def timer(point: int):
        def run() -> dict[str, float]:
            calls.append(point)
            slow = 10.0 if len(calls) <= 5 else 1.0
            return {"seconds": slow * (point + 1), "other": 2.0}
        return run

    medians = interleaved_medians([timer(p) for p in range(3)], repeats=5)
    assert calls == [0, 1, 2] * 6  # a warm-up pass, then five
    assert medians == [{"seconds": p + 1.0, "other": 2.0} for p in range(3)]
    assert interleaved_medians([lambda: 3.0], repeats=3) == [3.0]


def test_the_host_probe_times_the_linears_at_one_row(tiny_llama):
    """sim_fidelity's --host-check: the four linears at one row, per layer, as the tables'
    first point is timed (a layer's worth, not the model's)."""
    from minivllm.sim.calibrate import make_core
    from minivllm.sim.operators_calibrate import decode_probe, time_linears

    core = make_core(str(tiny_llama), 1, None, "auto")
    runner = core.runner
    probe = decode_probe(core, seconds=0.2)
    table = time_linears(runner.model.layers, runner.model.norm.weight.shape[0], [1],
                         runner.dtype, 3)
    one_row = sum(table[name]["seconds"][0] for name in LINEARS)
    assert 0 < probe < 10 * one_row and one_row < 10 * probe
