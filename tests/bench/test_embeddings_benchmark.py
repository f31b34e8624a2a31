"""benchmarks/embeddings_throughput.py runs and reports what a figure must name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.server_utils import stories_model

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "embeddings_throughput.py"


def test_embeddings_throughput_script_reports_rates_and_machine():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", str(stories_model()), "--num-inputs", "8",
         "--pooler-config", '{"pooling_type": "MEAN"}'],
        capture_output=True, text=True, timeout=300, check=True)
    assert "inputs/s" in result.stdout and "tokens/s" in result.stdout
    assert "CPU: " in result.stdout and "load average" in result.stdout
    assert "8 inputs of 16 tokens" in result.stdout and "dimension 64" in result.stdout
