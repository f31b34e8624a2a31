import pytest

from tests.model_factory import CONFIGS, STORIES, save_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory):
    """Every supported architecture as a tiny random-weight model directory."""
    root = tmp_path_factory.mktemp("models")
    return {kind: save_tiny_model(kind, root / kind) for kind in CONFIGS}


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
