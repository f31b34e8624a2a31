"""The mark of tests that need the C kernels built (they test the kernels against torch)."""

import pytest
import torch

from minivllm.model.kernels import library

needs_kernels = pytest.mark.skipif(not library.available(torch.device("cpu"), torch.float32),
                                   reason="the C kernels are not built here (no compiler?)")
