"""GET /slots and GET /props: llama-server's view of a server, read from minivllm's.

llama-server has `--parallel` slots, each serving one request at a time; minivllm's seats
are its `--max-num-seqs` (the requests one step may run). The requests in flight take the
seats in arrival order and the rest wait, as llama-server queues a request until a slot is
free (minivllm's scheduler may preempt one, which this view does not show)."""

from __future__ import annotations

import zlib
from pathlib import Path

from minivllm.entrypoints.llamacpp.gguf_metadata import read_scalars
from minivllm.entrypoints.llamacpp.settings import SAMPLERS, default_settings

BUILD_INFO = "minivllm"
# llama.cpp's names of the GGUF file types (general.file_type) its users meet
_FILE_TYPES = {0: "all F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
               10: "Q2_K - Medium", 11: "Q3_K - Small", 12: "Q3_K - Medium",
               13: "Q3_K - Large", 14: "Q4_K - Small", 15: "Q4_K - Medium",
               16: "Q5_K - Small", 17: "Q5_K - Medium", 18: "Q6_K", 32: "BF16"}


def next_seats(engine, n: int, max_num_seqs: int) -> list[int]:
    """The seats of n requests about to start (their id_slot), -1 for one that waits."""
    taken = len(engine.requests_in_flight())
    return [seat if seat < max_num_seqs else -1 for seat in range(taken, taken + n)]


def slots(engine, max_num_seqs: int) -> list[dict]:
    groups = engine.requests_in_flight()[:max_num_seqs]
    n_ctx = engine.max_model_len
    out = []
    for seat in range(max_num_seqs):
        slot = {"id": seat, "n_ctx": n_ctx, "speculative": False,
                "is_processing": seat < len(groups)}
        if seat < len(groups):
            slot.update(_task(groups[seat], n_ctx))
        out.append(slot)
    return out


def _task(group, n_ctx: int) -> dict:
    """A seat's request: its prompt and progress, its sampling as llama-server names it."""
    seq = group.sequences[0]
    params, n_decoded = seq.params, len(seq.output_token_ids)
    max_tokens = params.max_tokens if params.max_tokens is not None else -1
    n_remain = -1 if max_tokens == -1 else max(0, max_tokens - n_decoded)
    text = seq.detokenizer.text
    return {
        # llama-server's task ids are numbers; ours are strings: a stable number for each
        "id_task": zlib.crc32(group.request_id.encode()),
        "n_prompt_tokens": len(group.prompt_token_ids),
        "n_prompt_tokens_processed": len(group.prompt_token_ids) - group.num_cached_tokens,
        "n_prompt_tokens_cache": group.num_cached_tokens,
        "params": {**default_settings(), "seed": params.seed if params.seed is not None
                   else 0xFFFFFFFF, "temperature": params.temperature,
                   "top_k": params.top_k, "top_p": params.top_p, "min_p": params.min_p,
                   "repeat_penalty": params.repetition_penalty,
                   "presence_penalty": params.presence_penalty,
                   "frequency_penalty": params.frequency_penalty, "max_tokens": max_tokens,
                   "n_predict": max_tokens, "ignore_eos": params.ignore_eos,
                   "n_probs": params.logprobs or 0, "samplers": SAMPLERS},
        "next_token": [{"has_next_token": seq.finish_reason is None,
                        "has_new_line": "\n" in text, "n_remain": n_remain,
                        "n_decoded": n_decoded}],
    }


def file_type(gguf: Path | None) -> str:
    """A GGUF file's type as llama.cpp names it (its general.file_type), "" for a model of
    another format."""
    if gguf is None:
        return ""
    ftype = read_scalars(gguf, {"general.file_type"}).get("general.file_type")
    return _FILE_TYPES.get(ftype, "" if ftype is None else f"file type {ftype}")


def props(engine, base, model_path: str, model_ftype: str, max_num_seqs: int) -> dict:
    tokenizer = base.tokenizer
    return {
        "default_generation_settings": {"params": default_settings(),
                                        "n_ctx": engine.max_model_len},
        "total_slots": max_num_seqs,
        "model_alias": base.model_name,
        "model_ftype": model_ftype,
        "model_path": model_path,
        "modalities": {"vision": False, "video": False, "audio": False},
        "media_marker": "<__media__>",  # no multimodal input: a marker nothing carries
        "endpoint_slots": True,
        "endpoint_props": False,
        "endpoint_metrics": True,
        "ui": False,  # no web UI (minivllm's dashboard is at /dashboard)
        "ui_settings": {},
        "chat_template": base.chat_template or tokenizer.chat_template or "",
        "chat_template_caps": {},
        "bos_token": tokenizer.bos_token or "",
        "eos_token": tokenizer.eos_token or "",
        "build_info": BUILD_INFO,
        "is_sleeping": False,
        "cors_proxy_enabled": False,
    }
