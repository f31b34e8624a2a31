"""How well output lengths of a real instruct model can be ranked before it answers: the
`probe` length predictor on SmolLM2-135M-Instruct's own sampled outputs, scored on held-out
prompts, beside what bounds it.

In-process (no server, no timings): the engine runs every prompt of a custom prompt file
(default benchmarks/data/chat_prompts.jsonl) through the model's chat template --samples
times, sampled (temperature 0.7, per-request seeds), each ending at the model's EOS or at
--max-tokens. The engine runs `sjf` with the `probe` predictor, so its runner hands over the
final-norm hidden state of each prompt's last token exactly as in serving; the script records
it when the request finishes (the predictor's own observe()). Then, on a fixed held-out split
(--test-fraction of the prompts, seeded):

- `probe`: core/length_predictor.ProbePredictor, fed the training prompts' hidden states
  and their first sample's length, asked for each held-out prompt (its learning curve over
  growing training sets);
- prompt length alone: `bucket` (core/length_predictor.BucketPredictor) and a ridge on
  log prompt length;
- the sampling-noise ceiling: Kendall's tau between two samples' lengths of the same prompts
  (no predictor can rank one sample's length better than the sample's own noise allows), and
  between the mean of the other samples and one sample (closer to the best a deterministic
  predictor scores against a single sample).

    python benchmarks/lab_real_model.py [--model GGUF] [--prompts FILE] [--samples 3]
        [--save PATH.npz | --load PATH.npz]

`--save` keeps what the model produced (hidden states, prompt and output lengths) so the
analysis can be rerun with `--load` without generating again.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from minivllm.bench.models import smollm2_gguf
from minivllm.bench.prediction import kendall_tau
from minivllm.bench.prompt_file import read_custom
from minivllm.bench.timing import timed
from minivllm.core.length_predictor import BucketPredictor, OnlineRidge, ProbePredictor

DEFAULT_PROMPTS = Path(__file__).parent / "data" / "chat_prompts.jsonl"


class Finished:
    """What the predictor learns from when a request ends: its hidden state and lengths."""

    def __init__(self, prompt_hidden, num_prompt_tokens: int, num_output_tokens: int,
                 max_tokens: int) -> None:
        self.prompt_hidden = np.asarray(prompt_hidden, dtype=np.float64)
        self.num_prompt_tokens = num_prompt_tokens
        self.num_output_tokens = num_output_tokens
        self.max_tokens = max_tokens

    @classmethod
    def of(cls, request) -> Finished:
        return cls(request.prompt_hidden, request.num_prompt_tokens, request.num_output_tokens,
                   request.max_tokens)


def save(path: Path, rows: list[list[Finished]]) -> None:
    np.savez(path, hidden=np.array([r[0].prompt_hidden for r in rows]),
             prompt_tokens=np.array([r[0].num_prompt_tokens for r in rows]),
             output_tokens=np.array([[x.num_output_tokens for x in r] for r in rows]),
             max_tokens=rows[0][0].max_tokens)


def load(path: Path) -> list[list[Finished]]:
    d = np.load(path)
    return [[Finished(h, int(p), int(n), int(d["max_tokens"])) for n in outs]
            for h, p, outs in zip(d["hidden"], d["prompt_tokens"], d["output_tokens"],
                                  strict=True)]


def generate(model: str, prompts: list[str], samples: int, temperature: float,
             max_tokens: int, seed: int) -> list[list[Finished]]:
    """rows[i][s]: prompt i's sample s."""
    from minivllm import LLM, SamplingParams

    llm = LLM(model=model, scheduling_policy="sjf", length_predictor="probe")
    predictor = llm.llm_engine.scheduler.policy.predictor
    seen: dict[str, Finished] = {}
    observe = predictor.observe

    def record(request) -> None:
        seen[request.request_id] = Finished.of(request)
        observe(request)

    predictor.observe = record
    rows: list[list[Finished]] = [[] for _ in prompts]
    for s in range(samples):
        params = [SamplingParams(temperature=temperature, max_tokens=max_tokens,
                                 seed=seed + s * len(prompts) + i) for i in range(len(prompts))]
        outs, seconds = timed(llm.chat, [[{"role": "user", "content": p}] for p in prompts],
                              params, use_tqdm=False)
        for i, out in enumerate(outs):
            rows[i].append(seen.pop(out.request_id))
        lengths = [r[s].num_output_tokens for r in rows]
        print(f"sample {s}: {seconds:.0f} s, output tokens mean "
              f"{np.mean(lengths):.0f}, median {np.median(lengths):.0f}, min {min(lengths)}, "
              f"max {max(lengths)}, at the cap {sum(n >= max_tokens for n in lengths)}",
              flush=True)
    return rows


def probe_predictions(train: list[Finished], test: list[Finished],
                      alpha: float = 10.0) -> list[float]:
    probe = ProbePredictor(alpha=alpha)
    for r in train:
        probe.observe(r)
    return [probe.predict(r) for r in test]


def bucket_predictions(train: list[Finished], test: list[Finished]) -> list[float]:
    bucket = BucketPredictor()
    for r in train:
        bucket.observe(r)
    return [bucket.predict(r) for r in test]


def prompt_length_predictions(train: list[Finished], test: list[Finished]) -> list[float]:
    ridge = OnlineRidge(alpha=1.0)
    for r in train:
        x = math.log(r.num_prompt_tokens)
        ridge.add([x, x * x], math.log1p(r.num_output_tokens))
    return [ridge.predict([math.log(r.num_prompt_tokens), math.log(r.num_prompt_tokens) ** 2])
            for r in test]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="(default: SmolLM2-135M-Instruct's GGUF)")
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--samples", type=int, default=3, help="samples per prompt (>= 2)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--test-fraction", type=float, default=0.4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", type=Path, default=None, help="write the figures as JSON")
    ap.add_argument("--save", type=Path, default=None, help="keep the generated data (.npz)")
    ap.add_argument("--load", type=Path, default=None, help="analyse saved data instead")
    ap.add_argument("--score-cap", type=int, default=None,
                    help="cut every output length to N before the analysis, as a lower "
                         "max_tokens would have (e.g. bench's --custom-output-len 256)")
    args = ap.parse_args()
    if args.load:
        rows = load(args.load)
        args.samples, args.max_tokens = len(rows[0]), rows[0][0].max_tokens
    else:
        if args.model is None:
            args.model = str(smollm2_gguf())
        rows = generate(args.model, read_custom(args.prompts), args.samples, args.temperature,
                        args.max_tokens, args.seed)
        if args.save:
            save(args.save, rows)
    if args.score_cap:
        args.max_tokens = min(args.max_tokens, args.score_cap)
        rows = [[Finished(x.prompt_hidden, x.num_prompt_tokens,
                          min(x.num_output_tokens, args.max_tokens), args.max_tokens)
                 for x in r] for r in rows]
    order = np.random.default_rng(args.seed).permutation(len(rows))
    n_test = round(len(rows) * args.test_fraction)
    test_idx, train_idx = order[:n_test], order[n_test:]
    test = [rows[i][0] for i in test_idx]
    truth = [r.num_output_tokens for r in test]
    figures: dict = {"prompts": len(rows), "test": n_test, "samples": args.samples,
                     "temperature": args.temperature, "max_tokens": args.max_tokens}

    def tau(pred, true=truth) -> float | None:  # None: constant predictions rank nothing
        value = kendall_tau(pred, true)
        return None if value is None else round(value, 3)

    curve = {}
    for n in sorted({8, 16, 32, 64, 128, len(train_idx)}):
        if n <= len(train_idx):
            curve[n] = tau(probe_predictions([rows[i][0] for i in train_idx[:n]], test))
    train = [rows[i][0] for i in train_idx]
    figures["probe_tau_by_training_requests"] = curve
    figures["bucket_tau"] = tau(bucket_predictions(train, test))
    figures["prompt_length_ridge_tau"] = tau(prompt_length_predictions(train, test))
    figures["prompt_tokens_tau"] = tau([r.num_prompt_tokens for r in test])
    # Sampling noise: every prompt, sample 0 against sample 1, and the mean of the others.
    first = [r[0].num_output_tokens for r in rows]
    figures["two_samples_tau"] = tau([r[1].num_output_tokens for r in rows], first)
    if args.samples >= 3:
        others = [np.mean([x.num_output_tokens for x in r[1:]]) for r in rows]
        figures[f"mean_of_{args.samples - 1}_samples_tau"] = tau(others, first)
    # The probe trained on every sample of the training prompts (more targets, same prompts).
    many = [x for i in train_idx for x in rows[i]]
    figures["probe_tau_all_samples_train"] = tau(probe_predictions(many, test))
    # The probe's ridge penalty (default 10) against stronger ones, on the whole training set.
    figures["probe_tau_by_alpha"] = {a: tau(probe_predictions(train, test, a))
                                     for a in (1.0, 10.0, 100.0, 1000.0, 10000.0)}
    print(json.dumps(figures, indent=1))
    if args.output:
        args.output.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
