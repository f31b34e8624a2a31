"""`make test-cuda`: the CUDA backend, run for real on a GPU. Without one these tests fail
(they never skip): a green run of this target means the GPU path ran."""

import pytest
import torch


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/cuda/" in str(item.fspath):
            item.add_marker(pytest.mark.cuda)


@pytest.fixture(autouse=True)
def cuda_device():
    if not torch.cuda.is_available():
        pytest.fail("no CUDA device: `make test-cuda` needs a GPU that torch can see")
    return torch.device("cuda")
