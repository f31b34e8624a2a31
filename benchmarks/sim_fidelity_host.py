"""How much of a fidelity run's step-time error is the host's speed: each replay's steps
re-priced with the layers' linears at the speed the host probe measured around that replay.

    python benchmarks/sim_fidelity_host.py results/sim/fidelity8_qwen_zen5.json

Reads what `benchmarks/sim_fidelity.py --operators --host-check PCT --output F.json` wrote:
F.json (each replay's steps, measured and predicted, and its host probes before and after)
and F.operators.json (the tables; F.POLICY.operators.json after --calibrate-per-policy;
--tables for a run given --profile). For each replay: the probes, the step-time error per
step kind as the benchmark reported it, and again with the linears of each step of at most
STREAMING_ROWS rows priced at (1 + the mean of the two probes) x the tables' — the model's
own error once the host's memory speed that minute is known. A diagnosis, not the
simulator's prediction: the simulator runs at the calibration's speed; a host whose
memory-bound speed moves by a tenth or more while nothing else runs in the guest (the Zen
5, 2026-11-29/30) moves every decode with it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from minivllm.core.step_batch import StepBatch
from minivllm.sim.operators_model import OperatorCostModel
from minivllm.sim.step_kinds import describe, relative_errors

# Up to this many rows a linear streams its weights, as the probe's one row does; past it,
# arithmetic sets its time and the host's memory speed does not move it as much.
STREAMING_ROWS = 16


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("fidelity_json")
    p.add_argument("--tables", default=None,
                   help="the operator tables the run used (default: FIDELITY.operators.json or "
                   "FIDELITY.POLICY.operators.json, which the benchmark writes when it "
                   "calibrates)")
    args = p.parse_args()
    path = Path(args.fidelity_json)
    doc = json.loads(path.read_text())
    for name, run in doc["runs"].items():
        policy = name.rsplit("/", 1)[1]
        own = path.with_suffix(f".{policy}.operators.json")  # --calibrate-per-policy's
        tables = json.loads(Path(args.tables or (own if own.exists() else path.with_suffix(
            ".operators.json"))).read_text())
        cost = OperatorCostModel(tables["tables"], tables["overhead"], tables["machine"],
                                 tables["engine"])
        layers = cost.engine["num_layers"]
        checks = run.get("host_checks") or []
        if not checks:
            raise SystemExit(f"{path}: {name} has no host probes (run with --host-check)")
        speed = (checks[-1]["host_before"] + checks[-1]["host_after"]) / 2
        steps = [(StepBatch(**b), measured, predicted) for b, measured, predicted in run["steps"]]
        adjusted = [(b, measured, predicted + speed * layers * cost.linears_time(b.num_tokens)
                     * (b.num_tokens <= STREAMING_ROWS)) for b, measured, predicted in steps]
        print(f"## {name}: host probe {checks[-1]['host_before']:+.1%} before, "
              f"{checks[-1]['host_after']:+.1%} after ({len(checks)} attempt(s))\n"
              f"  as reported:             {describe(relative_errors(steps))}\n"
              f"  linears at the probed speed: {describe(relative_errors(adjusted))}")


if __name__ == "__main__":
    main()
