"""llama-server's flags on `minivllm serve`: each refused by name with the minivllm flag that
does its job (or why none does), instead of argparse's bare "unrecognized arguments", so that
a llama-server command line is fixed in one reading (docs/coming-from-llama-cpp.md)."""

from __future__ import annotations

import argparse

# (llama-server's spellings, what to write instead); flags both servers spell the same
# (--host, --port, --api-key, --seed) are not here: they work
FLAGS = [
    (("-m", "--model-path"), "give the file as MODEL: `minivllm serve FILE.gguf`"),
    (("-hf", "--hf-repo"), "give the hub file as MODEL: `minivllm serve org/repo:Q4_K_M`"),
    (("-c", "--ctx-size"), "--max-model-len N (each request's context; the KV cache is one "
                           "pool: --kv-cache-space)"),
    (("-np", "--parallel"), "--max-num-seqs N (the requests one step runs)"),
    (("-t", "--threads"), "--engine-threads N"),
    (("-tb", "--threads-batch"), "--engine-threads N (one thread count)"),
    (("-b", "--batch-size"), "--max-num-batched-tokens N"),
    (("-ub", "--ubatch-size"), "--max-num-batched-tokens N (no micro-batches)"),
    (("-ngl", "--n-gpu-layers", "--gpu-layers"), "no layer offload: --device cuda runs the "
                                                 "whole model on a GPU, --device cpu on CPUs"),
    (("-fa", "--flash-attn"), "drop it: the paged attention kernels are always on"),
    (("-ctk", "--cache-type-k", "-ctv", "--cache-type-v"), "--kv-cache-dtype int8 (or fp8, "
                                                           "bfloat16)"),
    (("-a", "--alias"), "--served-model-name NAME"),
    (("--chat-template-file",), "--chat-template FILE"),
    (("--jinja",), "drop it: chat templates are always Jinja"),
    (("--embedding", "--embeddings"), "--runner pooling"),
    (("--lora",), "--enable-lora --lora-modules NAME=DIR (PEFT folders)"),
    (("-md", "--model-draft"), "--speculative-config JSON"),
    (("-n", "--n-predict"), "a request's n_predict; a server-wide cap: "
                            "--override-generation-config '{\"max_new_tokens\": N}'"),
    (("--temp",), "--override-generation-config '{\"temperature\": T}' (the OpenAI routes; "
                  "/completion keeps llama-server's defaults)"),
    (("-cb", "--cont-batching", "--metrics", "--slots"), "drop it: always on"),
    (("--cache-reuse",), "drop it: the prefix cache is always on"),
    (("--mlock", "--no-mmap", "--numa", "--spm-infill", "-sm", "--split-mode", "-ts",
      "--tensor-split", "--ssl-key-file", "--ssl-cert-file", "--timeout"),
     "no counterpart in minivllm (docs/coming-from-llama-cpp.md)"),
]


class _LlamaServerFlag(argparse.Action):
    def __init__(self, option_strings, dest, hint: str, **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.hint = hint

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"{option_string} is llama-server's flag; minivllm serve: {self.hint}")


def add_llama_server_flags(parser: argparse.ArgumentParser) -> None:
    """The flags above on `parser`, hidden from --help, each failing with its hint."""
    for spellings, instead in FLAGS:
        parser.add_argument(*spellings, action=_LlamaServerFlag, hint=instead, nargs="?",
                            dest=f"llama_server_{spellings[0].lstrip('-')}",
                            default=argparse.SUPPRESS, help=argparse.SUPPRESS)
