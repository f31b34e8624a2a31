import pytest

from tests.model_factory import CONFIGS, STORIES, save_tiny_model


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
