"""llama-server's answers to /completion and /infill: a token's event in a stream, the last
answer (all of it unless streamed), `completion_probabilities`, `timings`, and
`response_fields` (the answer's chosen fields, nested ones named by their path)."""

from __future__ import annotations

from minivllm.entrypoints.llamacpp.pieces import token_bytes
from minivllm.entrypoints.llamacpp.progress import Progress
from minivllm.entrypoints.llamacpp.protocol import CompletionRequest
from minivllm.entrypoints.llamacpp.settings import settings
from minivllm.entrypoints.openai.serving import LOGPROB_FLOOR, OpenAIServing
from minivllm.outputs import Logprob, RequestOutput


def token_event(base: OpenAIServing, req: CompletionRequest, index: int, seat: int,
                out: RequestOutput, progress: Progress, text: str, token_ids: list[int],
                steps: list) -> dict:
    event = {"index": index, "content": text, "tokens": token_ids, "stop": False,
             "id_slot": seat, "tokens_predicted": len(progress.token_ids),
             "tokens_evaluated": len(out.prompt_token_ids)}
    if req.n_probs and steps:
        event["completion_probabilities"] = probs(base, req, token_ids, steps)
    return event


def final_answer(base: OpenAIServing, req: CompletionRequest, index: int, seat: int,
                 out: RequestOutput, progress: Progress) -> dict:
    """The last answer: with the whole text, tokens and probabilities unless streamed
    (then they went before, and these are empty)."""
    c = out.outputs[0]
    text, token_ids, steps = ("", [], []) if req.stream else (
        progress.text, progress.token_ids, progress.steps)
    n_predicted, n_prompt = len(progress.token_ids), len(out.prompt_token_ids)
    stop_word = c.stop_reason if isinstance(c.stop_reason, str) else ""
    stop_type = ("limit" if c.finish_reason == "length" or progress.cut else
                 "word" if stop_word else "eos" if c.finish_reason == "stop" else "none")
    answer = {
        "index": index, "content": text,
        "tokens": token_ids if req.return_tokens else [],
        "id_slot": seat, "stop": True, "model": base.model_name,
        "tokens_predicted": n_predicted, "tokens_evaluated": n_prompt,
        "generation_settings": settings(req),
        "prompt": base.tokenizer.decode(out.prompt_token_ids),
        "has_new_line": "\n" in progress.text,
        # the context's end reached (minivllm refuses a prompt that does not fit instead of
        # shifting the context as llama-server does)
        "truncated": stop_type == "limit" and n_prompt + n_predicted >= base.max_model_len,
        "stop_type": stop_type, "stopping_word": stop_word,
        "tokens_cached": out.num_cached_tokens,
        "timings": timings(out, n_predicted),
    }
    if req.n_probs and steps:
        answer["completion_probabilities"] = probs(base, req, token_ids, steps)
    return answer


def chosen_fields(answer: dict, paths: list[str]) -> dict:
    """`response_fields`: those of the paths ("timings/prompt_n") the answer has, each under
    its path; all of it when none are asked for."""
    if not paths:
        return answer
    chosen = {}
    for path in paths:
        value = answer
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            chosen[path] = value
    return chosen


def probs(base: OpenAIServing, req: CompletionRequest, token_ids: list[int],
          steps: list[dict[int, Logprob]]) -> list[dict]:
    def entry(tid: int, lp: Logprob) -> dict:
        text = base.token_str(tid, lp)
        # the text's bytes, unless the token holds part of a character
        data = token_bytes(base.tokenizer, tid) if "\ufffd" in text else text.encode()
        return {"id": tid, "token": text, "bytes": list(data),
                "logprob": max(lp.logprob, LOGPROB_FLOOR)}

    result = []
    for tid, step in zip(token_ids, steps):
        top = sorted(step.items(), key=lambda item: -item[1].logprob)[:req.n_probs]
        result.append({**entry(tid, step[tid]),
                       "top_logprobs": [entry(t, lp) for t, lp in top]})
    return result


def timings(out: RequestOutput, n_predicted: int) -> dict:
    """llama-server's timings: the prompt's part is from the first step scheduled to the
    first token, the prediction's from there to the last."""
    m = out.metrics
    prompt_ms = predicted_ms = 0.0
    if m is not None and m.first_token_time is not None:
        if m.first_scheduled_time is not None:
            prompt_ms = max(0.0, (m.first_token_time - m.first_scheduled_time) * 1e3)
        predicted_ms = max(0.0, ((m.last_token_time or m.first_token_time)
                                 - m.first_token_time) * 1e3)
    prompt_n = len(out.prompt_token_ids) - out.num_cached_tokens

    def rates(n: int, ms: float) -> tuple[float, float]:
        return (ms / n if n else 0.0), (n * 1e3 / ms if ms > 0 else 0.0)

    prompt_per_token, prompt_per_second = rates(prompt_n, prompt_ms)
    predicted_per_token, predicted_per_second = rates(n_predicted, predicted_ms)
    return {"cache_n": out.num_cached_tokens, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_per_token, "prompt_per_second": prompt_per_second,
            "predicted_n": n_predicted, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_per_token,
            "predicted_per_second": predicted_per_second}
