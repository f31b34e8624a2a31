"""Request models of llama-server's native API, with its field names and defaults (its
tools/server/README.md). Fields llama-server knows and minivllm does not run are accepted
at their disabled values and refused otherwise (serving.py); unknown fields are ignored,
as llama-server ignores them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

INT32 = 2**31 - 1
# llama-server's "no seed given": -1, or its LLAMA_DEFAULT_SEED, which /props reports
DEFAULT_SEED = 0xFFFFFFFF


class LlamaModel(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


# A prompt: text, token ids, or both mixed ([12, "text", 34]); several of them: a list of
# those (answered with a list)
Prompt = str | list[int | str]


class CompletionRequest(LlamaModel):
    prompt: Prompt | list[Prompt] = ""
    model: str | None = None
    n_predict: int = Field(-1, ge=-1, le=INT32)  # -1: until the context ends
    temperature: float = 0.8  # <= 0: greedy
    top_k: int = Field(40, ge=-INT32, le=INT32)  # <= 0: the whole vocabulary
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = Field(64, ge=-1, le=INT32)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: list[str] = Field(default_factory=list)
    seed: int = Field(-1, ge=-1, le=DEFAULT_SEED)
    stream: bool = False
    cache_prompt: bool = True  # the prefix cache is always on: accepted, it changes nothing
    n_probs: int = Field(0, ge=0, le=INT32)
    ignore_eos: bool = False
    return_tokens: bool = False
    n_keep: int = Field(0, ge=-1, le=INT32)
    id_slot: int = Field(-1, ge=-1, le=INT32)
    min_keep: int = Field(0, ge=0, le=INT32)
    json_schema: dict[str, Any] | None = None
    n_indent: int = Field(0, ge=0, le=INT32)  # lines after the first: at least this indented
    # the answer ends once a newline is written after this long generating (0: no limit)
    t_max_predict_ms: int = Field(0, ge=0, le=INT32)
    response_fields: list[str] = Field(default_factory=list)
    # Samplers minivllm does not run: their disabled values only
    typical_p: float = 1.0
    mirostat: int = 0
    dry_multiplier: float = 0.0
    xtc_probability: float = 0.0
    dynatemp_range: float = 0.0
    grammar: str = ""
    logit_bias: list | dict = Field(default_factory=list)
    post_sampling_probs: bool = False
    n_cmpl: int = Field(1, ge=1, le=1)


class InputExtra(LlamaModel):
    text: str
    filename: str = "tmp"


class InfillRequest(CompletionRequest):
    input_prefix: str
    input_suffix: str
    input_extra: list[InputExtra] = Field(default_factory=list)
    prompt: str = ""  # after the prefix, before the suffix: the cursor's line so far
