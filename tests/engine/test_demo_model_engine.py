"""The built-in demo model through the engine: found by name from the installed package,
greedy output token-identical to transformers, chat ends with EOS, and the wheel ships it."""

import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest

from minivllm import LLM, SamplingParams
from tests.conftest import assert_all_blocks_free
from tests.model_factory import hf_greedy

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo():
    return LLM("minivllm-demo", num_kv_blocks=128)


def test_greedy_matches_transformers(demo):
    prompt = "Once upon a time, there was a cat"
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    output = demo.generate(prompt, params, use_tqdm=False)[0]
    demo_dir = Path(str(resources.files("minivllm") / "demo_model"))
    expected, _ = hf_greedy(demo_dir, output.prompt_token_ids, 40)
    assert output.outputs[0].token_ids == expected
    assert "cat" in output.outputs[0].text
    assert_all_blocks_free(demo)


def test_chat_answer_ends_with_eos(demo):
    output = demo.chat([{"role": "user", "content": "Tell me a story about a dog."}],
                       SamplingParams(temperature=0, max_tokens=200), use_tqdm=False)[0]
    completion = output.outputs[0]
    assert completion.finish_reason == "stop" and "dog" in completion.text
    assert output.prompt_token_ids.count(demo.get_tokenizer().bos_token_id) == 1


def test_wheel_ships_the_demo_model(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True)
    wheel = next(tmp_path.glob("minivllm-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert f"minivllm/demo_model/{name}" in names
    assert wheel.stat().st_size < 15 * 2**20
