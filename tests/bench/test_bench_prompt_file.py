"""`--workload custom:PATH` (vLLM's custom dataset: JSONL of {"prompt": ...}): parsing, errors
naming the file and line, seeded shuffles and Poisson arrivals, and `bench serve` sending the
file's prompts as chat messages the model ends (no ignore_eos, sampled, max_tokens a cap)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minivllm.bench.prompt_file import read_custom
from minivllm.bench.traces import build_trace
from tests.bench.test_bench_client import FakeServer, bench, fake_encode

ROOT = Path(__file__).resolve().parents[2]
CHAT_PROMPTS = ROOT / "benchmarks" / "data" / "chat_prompts.jsonl"


def write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def trace_of(path: Path, **kw):
    counts = [len(fake_encode(p)) for p in read_custom(path)]
    return build_trace(f"custom:{path}", prompt_tokens=counts, **kw)


def test_read_custom_keeps_prompts_in_order_skipping_blank_lines(tmp_path):
    path = write(tmp_path, ['{"prompt": "Hi there"}', "", '{"prompt": "Why?", "extra": 1}'])
    assert read_custom(path) == ["Hi there", "Why?"]


@pytest.mark.parametrize("bad, why", [
    ("{not json", "not a JSON object"),
    ('["a list"]', "expected a JSON object"),
    ('{"text": "no prompt field"}', '"prompt" must be a non-empty string'),
    ('{"prompt": "   "}', '"prompt" must be a non-empty string'),
    ('{"prompt": 3}', '"prompt" must be a non-empty string'),
])
def test_a_bad_line_names_the_file_and_line(tmp_path, bad, why):
    path = write(tmp_path, ['{"prompt": "fine"}', "", bad])
    with pytest.raises(ValueError, match=rf"prompts.jsonl, line 3: {why}"):
        read_custom(path)


def test_an_empty_file_and_a_missing_file_are_errors(tmp_path):
    with pytest.raises(ValueError, match="no prompts"):
        read_custom(write(tmp_path, [""]))
    with pytest.raises(ValueError, match="no such file"):
        build_trace(f"custom:{tmp_path / 'absent.jsonl'}", prompt_tokens=[])


def test_the_trace_needs_token_counts(tmp_path):
    with pytest.raises(ValueError, match="need the server's tokenizer"):
        build_trace("custom:" + str(write(tmp_path, ['{"prompt": "a"}'])))


def test_seeded_shuffle_oversampling_and_poisson_arrivals(tmp_path):
    prompts = [f"prompt number {i} " + "word " * i for i in range(10)]
    path = write(tmp_path, [json.dumps({"prompt": p}) for p in prompts])
    a = trace_of(path, seed=3, num_prompts=2000, request_rate=5.0)
    b = trace_of(path, seed=3, num_prompts=2000, request_rate=5.0)
    c = trace_of(path, seed=4, num_prompts=2000, request_rate=5.0)
    assert a.entries == b.entries and a.entries != c.entries
    texts = [e.prompt_text for e in a.entries]
    # each pass over the rows is a permutation of them: 200 passes, every row 200 times
    assert all(sorted(texts[k:k + 10]) == sorted(prompts) for k in range(0, 2000, 10))
    assert texts[:10] != prompts
    times = np.array([e.send_time for e in a.entries])
    gaps = np.diff(times)
    assert times[0] == 0 and (gaps >= 0).all()
    assert abs(gaps.mean() - 0.2) < 0.02 and abs(gaps.std() / gaps.mean() - 1) < 0.1  # Poisson
    for e in a.entries:
        assert e.prompt_tokens == len(fake_encode(e.prompt_text)) and e.output_tokens == 256
    ordered = trace_of(path, shuffle=False, start=2, num_prompts=3)
    assert [e.prompt_text for e in ordered.entries] == prompts[2:5]
    assert all(e.send_time == 0 for e in ordered.entries)  # default rate: all at once


def test_buckets_are_the_prompt_length_terciles_and_a_long_prompt_caps_its_answer(tmp_path):
    path = write(tmp_path, [json.dumps({"prompt": "w " * n}) for n in (2, 5, 9, 20, 40, 60)])
    trace = trace_of(path, custom_output_len=30, max_model_len=50, priority="length")
    lengths = sorted(e.prompt_tokens for e in trace.entries)
    assert trace.buckets == tuple(np.quantile(lengths, [1 / 3, 2 / 3]))
    by_len = {e.prompt_tokens: e for e in trace.entries}
    assert by_len[21].output_tokens == 29 and by_len[21].prompt_tokens == 21  # cap, not prompt
    assert by_len[10].output_tokens == 30 and trace.num_capped == 3
    assert by_len[3].priority == 0 and by_len[61].priority == 2


def test_bench_serve_sends_the_files_prompts_as_chat_the_model_ends(tmp_path, capsys):
    path = write(tmp_path, [json.dumps({"prompt": f"question {i} " + "x " * i})
                            for i in range(12)])
    server = FakeServer()
    with server as url:
        rc = bench("serve", "--base-url", url, "--dataset-name", "custom", "--dataset-path",
                   str(path), "--request-rate", "50", "--custom-output-len", "9",
                   "--output", str(tmp_path / "out"), "--disable-tqdm")
    assert rc == 0
    assert "prompts from the file" in capsys.readouterr().out
    bodies = server.record
    assert sorted(b["messages"][0]["content"] for b in bodies) == sorted(read_custom(path))
    for body in bodies:
        assert not body["ignore_eos"] and body["max_tokens"] == 9
        assert body["temperature"] == 0.7 and len(body["messages"]) == 1
    doc = json.loads((tmp_path / "out" / "run.json").read_text())
    assert doc["meta"]["workload"] == "custom:prompts.jsonl" and not doc["meta"]["ignore_eos"]
    counts = {b["messages"][0]["content"]: len(fake_encode(b["messages"][0]["content"]))
              for b in bodies}
    assert sorted(r["prompt_tokens"] for r in doc["requests"]) == sorted(counts.values())


def test_explicit_flags_win_over_the_custom_defaults(tmp_path):
    path = write(tmp_path, ['{"prompt": "one two three"}'] * 3)
    server = FakeServer()
    with server as url:
        assert bench("serve", "--base-url", url, "--workload", f"custom:{path}",
                     "--temperature", "0", "--ignore-eos", "--endpoint", "completions",
                     "--output", str(tmp_path / "out"), "--disable-tqdm") == 0
        with pytest.raises(SystemExit, match="needs --dataset-path"):
            bench("serve", "--base-url", url, "--dataset-name", "custom", "--disable-tqdm")
        with pytest.raises(SystemExit, match="needs --dataset-name custom"):
            bench("serve", "--base-url", url, "--dataset-path", str(path), "--disable-tqdm")
        bodies, server.record[:] = list(server.record), []
        assert bench("serve", "--base-url", url, "--dataset-name", "random", "--num-prompts",
                     "2", "--input-len", "6", "--output-len", "3",
                     "--output", str(tmp_path / "random"), "--disable-tqdm") == 0
    for body in bodies:
        assert body["prompt"] == "one two three" and body["ignore_eos"]
        assert body["temperature"] == 0
    # vLLM's random dataset: ids of the given length, exact output lengths, no sampling sent
    assert [len(b["prompt"]) for b in server.record] == [6, 6]
    assert all(b["ignore_eos"] and b["max_tokens"] == 3 and "temperature" not in b
               for b in server.record)


def test_the_committed_chat_prompts_are_what_the_script_writes(tmp_path):
    out = tmp_path / "chat_prompts.jsonl"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_chat_prompts.py"),
                    "--output", str(out)], check=True, capture_output=True)
    assert out.read_text() == CHAT_PROMPTS.read_text()
    prompts = read_custom(CHAT_PROMPTS)
    assert len(prompts) >= 250 and len(set(prompts)) == len(prompts)
