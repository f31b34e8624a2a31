"""benchmarks/sim_fidelity.py --host-check and benchmarks/sim_fidelity_host.py: a replay's
host probes are taken, reported and written, and the diagnosis reads them back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from minivllm.cli import main
from tests.server_utils import stories_model

ROOT = Path(__file__).resolve().parents[2]


def test_host_check_probes_each_replay_and_the_diagnosis_reprices_its_linears(tmp_path):
    tables = tmp_path / "operators.json"
    assert main(["sim", "calibrate", "--operators", "--model", str(stories_model()), "--quick",
                 "--num-threads", "1", "--output", str(tables)]) == 0
    out = tmp_path / "fidelity.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sim_fidelity.py"), "--model",
         str(stories_model()), "--threads", "1", "--profile", str(tables), "--workloads",
         "seed-low", "--policies", "fcfs", "--seed-prompts", "4", "--host-check", "1000",
         "--output", str(out)], capture_output=True, text=True, timeout=600, check=True)
    assert "seed-low, fcfs, attempt 1: host probe" in result.stdout
    [run] = json.loads(out.read_text())["runs"].values()
    [check] = run["host_checks"]  # within 1000%: one attempt
    assert check["host_before"] > -1 and check["host_after"] > -1
    assert check["step_time_error"]["n"] == len(run["steps"]) > 0
    diagnosis = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sim_fidelity_host.py"), str(out),
         "--tables", str(tables)], capture_output=True, text=True, timeout=120, check=True)
    assert "linears at the probed speed: all" in diagnosis.stdout


def test_host_check_refuses_a_run_without_operator_tables():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sim_fidelity.py"), "--host-check", "5"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "--host-check needs operator tables" in result.stderr


def test_calibrate_per_policy_times_the_tables_on_each_policys_engine(tmp_path):
    out = tmp_path / "fidelity.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sim_fidelity.py"), "--model",
         str(stories_model()), "--threads", "1", "--operators", "--calibrate-per-policy",
         "--workloads", "seed-low", "--policies", "fcfs", "sjf", "--seed-prompts", "3",
         "--output", str(out)], capture_output=True, text=True, timeout=900, check=True)
    assert "fcfs's engine: operator tables" in result.stdout
    doc = json.loads(out.read_text())
    assert set(doc["profiles"]) == {"fcfs", "sjf"} and doc["profile"] is None
    for policy in ("fcfs", "sjf"):
        tables = json.loads(out.with_suffix(f".{policy}.operators.json").read_text())
        assert tables["tables"]["decode_probe_seconds"] > 0
    assert not out.with_suffix(".operators.json").exists()  # no core of its own
