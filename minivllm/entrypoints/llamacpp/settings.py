"""The sampling settings as llama-server reports them: a /completion answer's
`generation_settings`, and `params` in /props and /slots. Samplers minivllm does not run
(dynamic temperature, XTC, DRY, mirostat, typical-p) are reported at their disabled values,
which are the only ones a request may give them."""

from __future__ import annotations

from minivllm.entrypoints.llamacpp.protocol import DEFAULT_SEED, CompletionRequest

# The order minivllm's sampler applies them in (one fused pass: penalties, temperature,
# top-k, top-p, min-p, then the draw)
SAMPLERS = ["penalties", "temperature", "top_k", "top_p", "min_p"]
_DISABLED = {
    "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "top_n_sigma": -1.0,
    "xtc_probability": 0.0, "xtc_threshold": 0.1,
    "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
    "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
    "adaptive_target": -1.0, "adaptive_decay": 0.9,
}
# What llama-server reports of its chat parsing, speculation and backend sampling: what a
# /completion request (raw text in, raw text out, no draft) has there
_PLAIN = {"chat_format": "Content-only", "reasoning_format": "none",
          "reasoning_in_content": False, "generation_prompt": "", "speculative.types": "none",
          "backend_sampling": False}


def settings(req: CompletionRequest, full: bool = True) -> dict:
    """`full`: a /completion answer's generation_settings; else the shorter `params` of
    /props and /slots (no stop strings, grammar or logit bias)."""
    out = {
        "seed": DEFAULT_SEED if req.seed == -1 else req.seed,
        "temperature": req.temperature,
        "top_k": req.top_k,
        "top_p": req.top_p,
        "min_p": req.min_p,
        **_DISABLED,
        "typical_p": req.typical_p,
        "repeat_last_n": req.repeat_last_n,
        "repeat_penalty": req.repeat_penalty,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "max_tokens": req.n_predict,
        "n_predict": req.n_predict,
        "n_keep": req.n_keep,
        "n_discard": 0,
        "ignore_eos": req.ignore_eos,
        "stream": req.stream,
        "n_probs": req.n_probs,
        "min_keep": req.min_keep,
        **_PLAIN,
        "samplers": SAMPLERS,
        "timings_per_token": False,
        "post_sampling_probs": req.post_sampling_probs,
        "lora": [],
    }
    if full:
        out.update({"stop": req.stop, "logit_bias": [], "grammar": req.grammar,
                    "grammar_lazy": False, "grammar_triggers": [], "preserved_tokens": [],
                    "dry_sequence_breakers": ["\n", ":", "\"", "*"]})
    return out


def default_settings(full: bool = False) -> dict:
    """A request that sets nothing: llama-server's defaults, which are minivllm's here."""
    return settings(CompletionRequest(), full)
