"""The measured choice between a linear's ways (--kernel-choice measure): which way runs
each row bucket, the table kept on disk, what is built, and whole models and engines on
it against the default."""

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from minivllm import LLM, SamplingParams
from minivllm.config import ModelConfig
from minivllm.core.step_batch import row_bucket
from minivllm.model.kernels import library
from minivllm.model.linear.choice import (
    MEASURED_MAX_ROWS,
    ChoiceTable,
    ChosenLinear,
    KernelChoice,
    row_buckets,
    row_padding,
    time_ways,
    timed_rows,
)
from minivllm.model.linear.registry import bf16_logits_stay_fp32, linear_ways
from minivllm.model.loader import load_state_dict
from minivllm.model.models import build_model

needs_onednn = pytest.mark.skipif(
    not (library.available(torch.device("cpu"), torch.float32)
         and torch.backends.mkldnn.is_available()),
    reason="oneDNN or the C kernels are not available here: fp32 has one way")


class _Spy:
    """A way that records the rows of each call and computes x @ w.T."""

    def __init__(self, weight, log, name):
        self.weight, self.log, self.name = weight, log, name

    def __call__(self, x, residual=None):
        self.log.append((self.name, x.shape[0]))
        y = F.linear(x, self.weight)
        return y if residual is None else residual + y


def _fake_timer(fast_below: int, calls: list):
    """"b" is faster below `fast_below` rows, "a" from there on."""
    def timer(ways, k, rows):
        calls.append(rows)
        return {"a": 2.0 if rows < fast_below else 1.0, "b": 1.0 if rows < fast_below else 2.0}
    return timer


def _builders(weight, log, built):
    def make(name):
        def build():
            built.append(name)
            return _Spy(weight, log, name)
        return build
    return {"a": make("a"), "b": make("b")}


def test_buckets_are_powers_of_two_up_to_the_measured_max():
    assert row_buckets(1) == [1]
    assert row_buckets(5) == [1, 2, 4, 8]
    assert row_buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert row_buckets(2048)[-1] == MEASURED_MAX_ROWS
    n = len(row_buckets(64))
    assert [row_bucket(r, n) for r in (1, 2, 3, 4, 5, 33, 64, 65, 5000)] == \
        [0, 1, 2, 2, 3, 6, 6, 6, 6]


def test_each_bucket_runs_its_faster_way(tmp_path):
    log, built, calls = [], [], []
    weight = torch.randn(6, 5)
    choice = KernelChoice(64, 8, ChoiceTable(tmp_path / "t.json"), _fake_timer(8, calls))
    layer = choice.choose(_builders(weight, log, built), 6, 5, False)
    assert isinstance(layer, ChosenLinear)
    assert layer.winners == ["b", "b", "b", "a", "a", "a", "a"]  # 1, 2, 4 | 8 .. 64 rows
    for rows in (1, 3, 4, 5, 8, 9, 64, 100):
        x, residual = torch.randn(rows, 5), torch.randn(rows, 6)
        torch.testing.assert_close(layer(x, residual), residual + F.linear(x, weight))
    assert [name for name, _ in log[-8:]] == ["b", "b", "b", "a", "a", "a", "a", "a"]
    assert calls == [1, 2, 4, 8, 16, 17, 32, 33, 64]  # above 16 rows, both ends


def test_a_step_pads_its_rows_only_where_a_onednn_way_runs(tmp_path):
    """oneDNN ("a" here) wins the 257-512 bucket (and on), the panels ("b") below: 129 rows
    run the panels unpadded (they were padded to 192 while any bucket was oneDNN's: a
    128-token prompt with one decode beside it took 78 ms where the prompt alone took 50);
    from 257 on a step pads to oneDNN's buckets. A linear always on oneDNN pads always."""
    def builders():
        ways = _builders(torch.randn(6, 5), [], [])
        build_a = ways["a"]

        def onednn_a():
            way = build_a()
            way.onednn = True
            return way
        return {"a": onednn_a, "b": ways["b"]}

    layer = KernelChoice(512, 8, ChoiceTable(None), _fake_timer(512, [])).choose(
        builders(), 6, 5, False)
    padding = row_padding([layer])
    assert [padding.rows(r) for r in (1, 17, 65, 129, 256, 257, 300, 1000)] == \
        [1, 17, 65, 129, 256, 320, 320, 1024]
    always = row_padding([layer, SimpleNamespace(onednn=True)])
    assert always.rows(129) == 192 and always.rows(17) == 32
    assert row_padding([SimpleNamespace()]).rows(129) == 129  # no oneDNN: never pads


def test_a_bucket_goes_to_the_way_faster_across_it_not_at_its_top_alone():
    """"a" pads to oneDNN's counts: 5% faster at 512 rows, 30% slower at 257 (run as 320).
    Over the bucket "b" is faster, and runs it; where "a" wins at both ends, "a" runs."""
    def padding_a(ways, k, rows):
        return {"a": 0.95 * rows if rows == 512 else 1.3 * rows, "b": 1.0 * rows}

    def builders():
        return _builders(torch.randn(6, 5), [], [])

    layer = KernelChoice(512, 8, ChoiceTable(None), padding_a).choose(builders(), 6, 5, False)
    assert layer.name == "b"
    assert timed_rows(512) == [257, 512] and timed_rows(16) == [16]
    always = KernelChoice(512, 8, ChoiceTable(None), lambda ways, k, rows: {"a": 1.0, "b": 1.1})
    assert always.choose(builders(), 6, 5, False).name == "a"


def test_the_table_is_kept_and_reused(tmp_path):
    path, calls = tmp_path / "t.json", []
    weight = torch.randn(6, 5)
    KernelChoice(16, 8, ChoiceTable(path), _fake_timer(8, calls)).choose(
        _builders(weight, [], []), 6, 5, False)
    saved = json.loads(path.read_text())
    assert saved["machine"]["torch"] == torch.__version__
    assert "a+b|6x5|no bias|16" in saved["times"]

    def no_timing(ways, k, rows):
        raise AssertionError("measured again although the table has the times")
    built = []
    layer = KernelChoice(16, 8, ChoiceTable(path), no_timing).choose(
        _builders(weight, [], built), 6, 5, False)
    assert layer.winners == ["b", "b", "b", "a", "a"] and sorted(built) == ["a", "b"]
    # another shape, bias or way set is another entry: measured
    calls.clear()
    KernelChoice(16, 8, ChoiceTable(path), _fake_timer(8, calls)).choose(
        _builders(weight, [], []), 6, 5, True)
    assert calls == row_buckets(16)


def test_an_unreadable_table_is_measured_again(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("{not json")
    calls = []
    KernelChoice(4, 4, ChoiceTable(path), _fake_timer(8, calls)).choose(
        _builders(torch.randn(6, 5), [], []), 6, 5, False)
    assert calls == [1, 2, 4] and "a+b|6x5|no bias|4" in json.loads(path.read_text())["times"]


def test_one_winner_builds_only_it_and_a_tie_keeps_the_default(tmp_path):
    built = []
    layer = KernelChoice(64, 8, ChoiceTable(None), _fake_timer(1, [])).choose(
        _builders(torch.randn(6, 5), [], built), 6, 5, False)
    assert isinstance(layer, _Spy) and layer.name == "a"
    assert built == ["a", "b", "a"]  # both to measure, then the winner alone
    tie = KernelChoice(8, 8, ChoiceTable(None), lambda ways, k, rows: dict.fromkeys(ways, 1.0))
    assert tie.choose(_builders(torch.randn(6, 5), [], []), 6, 5, False).name == "a"


@needs_onednn
def test_fp32_ways_agree_and_time_ways_measures_each():
    weight, bias = torch.randn(96, 64) * 0.1, torch.randn(96)
    ways = {name: build() for name, build in linear_ways(weight, bias, True, None).items()}
    panels = ["fp32 panels"] if library.panel_width() else []  # AVX2 and above
    assert list(ways) == ["oneDNN", "torch", *panels]
    for rows in (1, 15, 17, 513):
        x = torch.randn(rows, 64)
        for way in ways.values():
            torch.testing.assert_close(way(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    times = time_ways(ways, 64, 16)
    assert set(times) == set(ways) and all(0 < t < 1 for t in times.values())


def test_bf16_ways_keep_oneDNNs_rounded_output_off_the_lm_head():
    """On a CPU with AMX, AVX512-BF16 and the panels (a faked Machine: the ways are only
    listed, not built): every way for a layer, AMX first (the default); for the LM head,
    whose logits must stay fp32, not oneDNN's bf16, which rounds its output. Without AMX the
    bf16 dot panels keep the head in bf16, fp32 logits; without them it is fp32."""
    machine = SimpleNamespace(amx=True, panels=True, bf16_pairs=True, onednn_bf16=True)
    weight = torch.randn(32, 64)

    def ways(fast=True, head=False):
        return list(linear_ways(weight, None, fast, "bf16", head, machine))

    assert ways() == ["AMX bf16", "oneDNN bf16", "bf16 dot panels", "bf16 panels"]
    assert ways(head=True) == ["AMX bf16", "bf16 dot panels", "bf16 panels"]
    assert ways(fast=False) == ["bf16"]  # no kernels: torch
    machine.amx = False
    assert ways() == ["oneDNN bf16", "bf16 dot panels", "bf16 panels"]
    assert ways(head=True) == ["bf16 dot panels", "bf16 panels"]
    assert bf16_logits_stay_fp32(weight, True, machine)
    machine.bf16_pairs = False
    assert not bf16_logits_stay_fp32(weight, True, machine)  # CausalLM's head stays fp32


@needs_onednn
def test_a_model_on_chosen_ways_matches_the_default(tiny_llama, tmp_path):
    """Every bucket winning with another way, in turn (oneDNN, torch, the fp32 panels where
    they run): the logits equal the default build's at every row count."""
    from transformers import AutoConfig

    def alternate(ways, k, rows):
        fast = list(ways)[rows.bit_length() % len(ways)]
        return {name: 1.0 if name == fast else 2.0 for name in ways}

    cfg = AutoConfig.from_pretrained(tiny_llama)
    weights = load_state_dict(tiny_llama)
    default = build_model(cfg, dict(weights))
    chosen = build_model(cfg, dict(weights), kernel_choice=KernelChoice(
        64, 8, ChoiceTable(None), alternate))
    assert isinstance(chosen.layers[0].mlp.gate_up, ChosenLinear)
    for rows in (1, 2, 3, 4, 17, 64):
        x = torch.randn(rows, cfg.hidden_size)
        torch.testing.assert_close(chosen.compute_logits(x), default.compute_logits(x),
                                   rtol=1e-4, atol=1e-4)
        layer, ref = chosen.layers[0].mlp.gate_up, default.layers[0].mlp.gate_up
        torch.testing.assert_close(layer(x), ref(x), rtol=1e-4, atol=1e-4)


@needs_onednn
def test_the_runner_pads_a_step_only_in_the_buckets_oneDNN_runs(tiny_llama):
    """A model whose linears run oneDNN in their largest bucket only (33-64 rows) and torch
    below: the runner's padding leaves 17-32 rows as they are and pads 33 to 48."""
    from transformers import AutoConfig

    from minivllm.model.runner import _decoder_linears

    def onednn_on_top(ways, k, rows):
        return {name: 1.0 if (name == "oneDNN") == (rows == 64) else 2.0 for name in ways}

    cfg = AutoConfig.from_pretrained(tiny_llama)
    model = build_model(cfg, load_state_dict(tiny_llama), kernel_choice=KernelChoice(
        64, 8, ChoiceTable(None), onednn_on_top))
    padding = row_padding(_decoder_linears(model))
    assert [padding.rows(r) for r in (17, 20, 32, 33, 50)] == [17, 20, 32, 48, 64]


def test_kernel_choice_flag_and_environment(monkeypatch):
    assert ModelConfig(kernel_choice="measure").kernel_choice == "measure"
    monkeypatch.setenv("MINIVLLM_KERNEL_CHOICE", "default")
    assert ModelConfig().kernel_choice == "default"
    monkeypatch.delenv("MINIVLLM_KERNEL_CHOICE")
    assert ModelConfig().kernel_choice == "measure"
    with pytest.raises(ValueError, match="kernel_choice.*must be auto, measure or default"):
        ModelConfig(kernel_choice="fastest")


@needs_onednn
def test_the_engine_measures_once_per_machine(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    params = SamplingParams(max_tokens=8, temperature=0)
    outputs = []
    for kernel_choice in ("default", "measure", "measure"):
        llm = LLM(model=str(tiny_llama), kernel_choice=kernel_choice, max_num_seqs=4, num_threads=1,
                  max_num_batched_tokens=64)
        outputs.append(llm.generate(["one two three"], params)[0].outputs[0].token_ids)
        files = list((tmp_path / "kernel_choice").glob("*.json"))
        if kernel_choice == "default":
            assert not files
        else:
            assert len(files) == 1
            entries = json.loads(files[0].read_text())["times"]
            assert any(key.endswith("|64") for key in entries)  # the step's rows
        del llm
    assert outputs[0] == outputs[1] == outputs[2]
