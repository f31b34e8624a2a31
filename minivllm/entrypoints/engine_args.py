"""CLI flags for every engine argument (config.py's ENGINE_ARGS), spelled as vLLM spells them
(--max-num-seqs ...)."""

from __future__ import annotations

import argparse

from minivllm.config import ENGINE_ARGS, EngineConfig
from minivllm.core.kv_transfer import parse_kv_transfer_config
from minivllm.core.length_predictor import LENGTH_PREDICTORS
from minivllm.core.policy import POLICIES
from minivllm.core.speculative import parse_speculative_config
from minivllm.generation_fields import parse_override
from minivllm.pooling_params import parse_pooler_config

_HELP = {
    "model": "local Hugging Face model directory, hub id, or 'minivllm-demo'",
    "dtype": "auto | float32 | bfloat16 | float16 (with a .gguf file's blocks: auto and "
             "float32 run float32 activations, bfloat16 the CPU's bf16: bf16 KV cache)",
    "quantization": "unset: gguf for a .gguf file, else none | none: every weight in "
                    "--dtype (a .gguf file's blocks dequantized at load) | int8: W8A8 linear "
                    "layers, quantized at load (dtype auto or float32) | gguf: a .gguf file's "
                    "linear weights and embeddings run as stored",
    "kernel_choice": "measure: time each linear's ways (oneDNN or torch fp32, AMX / oneDNN "
                     "/ panel bf16) per row count at load and run the fastest, the times kept "
                     "per machine | default: the first way, unmeasured | auto (default): "
                     "measure, unless MINIVLLM_KERNEL_CHOICE=default",
    "num_kv_blocks": "number of KV blocks (overrides --kv-cache-space)",
    "kv_cache_space": "GiB of memory for the KV cache; unset: 4 GiB, but no more than "
                      "--max-num-seqs requests of --max-model-len tokens can fill",
    "swap_space": "GiB of host memory for swapped-out KV blocks",
    "kv_cache_dtype": "auto (the model's dtype) | bfloat16: half the KV bytes of an fp32 "
                      "model, read by the attention kernels as fp32 | int8 | fp8 (fp8_e4m3) "
                      "| fp8_e5m2: one byte per value and an fp32 scale per token and KV head",
    "kv_offloading_backend": "disk: prefix-cache blocks evicted from memory are written to "
                             "--kv-offloading-path and loaded back instead of recomputed, "
                             "also after a restart (unset: off)",
    "kv_transfer_config": "prefill/decode disaggregation, vLLM's JSON: '{\"kv_connector\": "
                          "\"SharedStorageConnector\", \"kv_role\": \"kv_producer\" | "
                          "\"kv_consumer\" | \"kv_both\", \"kv_connector_extra_config\": "
                          "{\"shared_storage_path\": DIR}}': a producer writes the KV blocks it "
                          "computes to DIR, a consumer loads them from there",
    "kv_offloading_path": "with --kv-offloading-backend disk, the folder of the tier's files",
    "kv_offloading_size": "with --kv-offloading-backend disk, the GiB it may hold (least "
                          "recently used blocks deleted beyond)",
    "scheduling_policy": " | ".join(POLICIES),
    "length_predictor": " | ".join(LENGTH_PREDICTORS) + ": output lengths for sjf (and "
                        "other policies ranking by them); oracle reads the lab-only request "
                        "field oracle_output_len",
    "length_prediction_log": "append a JSON line per finished request (prompt tokens, "
                             "predicted and true output length) to this file",
    "preemption_mode": "recompute | swap (default: swap for multi-sequence requests)",
    "active_preemption": "let a better-ranked waiting request preempt a running one (when "
                         "KV blocks or max_num_seqs seats run out)",
    "preemption_victim": "lowest_rank (the policy's worst) | latest_arrival | least_work_done "
                         "(fewest computed tokens: the least recompute)",
    "vtc_weights": "vtc: W_P,W_Q, the service counted per prompt and per output token",
    "vtc_tenant_weights": "vtc: TENANT=WEIGHT,... (or a JSON object): a tenant of weight 2 "
                          "gets twice the service of one of weight 1; unlisted tenants "
                          "weigh 1",
    "edf_action": "edf: shed (finish with an error) | deprioritize (rank last) a request "
                  "that can no longer make its deadline",
    "ttft_slo_ms": "edf: the TTFT deadline (ms after arrival) of requests that give none",
    "e2e_slo_ms": "edf: the end-to-end deadline (ms after arrival) of requests that give none",
    "mlfq_base_quantum": "mlfq: the top level's quantum in decode iterations (doubling per "
                         "level)",
    "residual_sjf_max_wait_ms": "residual_sjf: a request queued this long goes before "
                                "younger ones, oldest first (0: FCFS)",
    "max_num_batched_tokens": "tokens per step (None: 512 with chunked prefill, else "
                              "max(2048, max_model_len))",
    "long_prefill_token_threshold": "with chunked prefill, the most tokens one request "
                                    "computes in a step (0: no cap): a long prompt is cut "
                                    "into chunks of this size and leaves room in each step "
                                    "for other prompts and the decodes; not applied to a "
                                    "request alone in the engine",
    "long_prefill_token_threshold_adaptive": "raise long_prefill_token_threshold to a fair "
                                             "share of the budget: max_num_batched_tokens / "
                                             "requests in the engine",
    "max_num_partial_prefills": "with chunked prefill, the most requests computing prompt "
                                "tokens in one step (default: no limit)",
    "max_long_partial_prefills": "of those, the most with more than "
                                 "long_prefill_token_threshold prompt tokens left, so short "
                                 "prompts pass long ones (default: no limit)",
    "target_tpot_ms": "with chunked prefill, pack each step that carries decodes so its "
                      "predicted time (learned from the steps run) stays within this: a "
                      "prefill chunk that would pass it is cut (default: off)",
    "enable_lora": "serve LoRA adapters (PEFT folders) on the base model: a request names "
                   "one by its \"model\" field (--lora-modules) or with a LoRARequest "
                   "(offline)",
    "max_loras": "with --enable-lora, the most adapters the running requests may use at "
                 "once (a request of another adapter waits)",
    "max_lora_rank": "with --enable-lora, the highest adapter rank accepted",
    "max_cpu_loras": "with --enable-lora, the adapters kept loaded (least recently used idle "
                     "ones dropped beyond; default: --max-loras)",
    "speculative_config": "speculative decoding, vLLM's JSON: '{\"method\": \"ngram\", "
                          "\"num_speculative_tokens\": 3, \"prompt_lookup_min\": 2, "
                          "\"prompt_lookup_max\": 5, \"disable_by_batch_size\": 8}' "
                          "(ngram: draft tokens looked up in the request's own prompt and "
                          "output; exact: the output is the same tokens)",
    "generation_config": "sampling defaults: 'auto' (the model's generation_config.json), "
                         "'vllm' (ignore it: SamplingParams' defaults) or a folder holding a "
                         "generation_config.json",
    "override_generation_config": "JSON object merged over the generation config, e.g. "
                                  "'{\"temperature\": 0.5, \"top_p\": 0.9}'",
    "pooler_config": "how /v1/embeddings and LLM.embed pool the prompt's hidden states, "
                     "vLLM's JSON: '{\"pooling_type\": \"MEAN\", \"normalize\": true}' "
                     "(pooling_type LAST | MEAN; unset: LAST, normalized)",
    "runner": "vLLM's: auto (generation and embeddings both) | generate (embeddings "
              "refused) | pooling (embeddings only: generation requests refused)",
    "convert": "vLLM's: auto | none (no embedding model: implies --runner generate) | embed "
               "(the model pooled as an embedding model: implies --runner pooling)",
}


def _json_object(parse):
    """argparse type of a dict field: a JSON object, checked by `parse`."""
    def parse_flag(text: str) -> dict:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse_flag


# The dict fields' JSON flags: argparse types that check them.
JSON_FLAGS = {
    "override_generation_config": _json_object(lambda text: parse_override(text, flag=None)),
    "speculative_config": _json_object(parse_speculative_config),
    "kv_transfer_config": _json_object(parse_kv_transfer_config),
    "pooler_config": _json_object(lambda text: parse_pooler_config(text, flag=None)),
}


def add_engine_args(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    for arg in ENGINE_ARGS.values():
        if arg.name in skip:
            continue
        flag = "--" + arg.name.replace("_", "-")
        default, hint = arg.default, str(arg.type)
        help_text = _HELP.get(arg.name, "") + f" (default: {default})"
        if "bool" in hint:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                help=help_text)
            continue
        if "dict" in hint:
            parser.add_argument(flag, type=JSON_FLAGS[arg.name], default=default,
                                metavar="JSON",
                                help=help_text)
            continue
        if "int" in hint:
            kind = int
        elif "float" in hint:
            kind = float
        else:
            kind = str
        parser.add_argument(flag, type=kind, default=default, help=help_text)


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    kwargs = {k: v for k, v in vars(args).items() if k in ENGINE_ARGS and v is not None}
    return EngineConfig(**kwargs)
