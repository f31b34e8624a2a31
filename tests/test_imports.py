"""core/ is pure Python: importing the scheduler (or anything in core/) loads no torch,
transformers or tqdm — also not through the package's __init__. Checked in a fresh
interpreter, since this test process has long imported them. (Which module may import which:
test_layering.py.)"""

import subprocess
import sys

HEAVY = ("torch", "transformers", "tqdm", "numpy")


def test_core_imports_no_torch():
    code = ("import sys, minivllm.core.scheduler, minivllm.core.policy, minivllm.core.kv_cache, "
            "minivllm.core.request, minivllm.core.scheduler_output, minivllm.core.router, "
            "minivllm.sampling_params, minivllm.config; "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_package_names_still_import_lazily():
    code = "import minivllm; print(minivllm.SamplingParams.__name__, minivllm.LLM.__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.split() == ["SamplingParams", "LLM"], result.stderr

