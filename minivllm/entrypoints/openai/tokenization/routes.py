"""vLLM's tokenizer routes: POST /tokenize (a prompt or chat messages), POST /detokenize and
GET /tokenizer_info, through the server's tokenizer and chat template. The same /tokenize
and /detokenize serve llama-server's form: a request with `content` is answered with
llama-server's keys; /detokenize, asked the same in both, answers both `prompt` (vLLM's)
and `content` (llama-server's)."""

from __future__ import annotations

from fastapi import FastAPI

from minivllm.entrypoints.llamacpp import tokenize as llamacpp
from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.serving import OpenAIServing
from minivllm.entrypoints.openai.tokenization.protocol import DetokenizeRequest, TokenizeRequest
from minivllm.entrypoints.openai.tokenization.tokenizer_info import tokenizer_info


def add_tokenization_routes(app: FastAPI, base: OpenAIServing) -> None:
    """`base`: the server's checks, tokenizer and chat template."""

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> dict:
        base.check_model(req.model)
        asked = sum(field is not None for field in (req.prompt, req.messages, req.content))
        if asked != 1:
            raise OpenAIError("give exactly one of prompt or messages (vLLM's form) or "
                              "content (llama-server's)", 400, "prompt")
        if req.content is not None:
            return llamacpp.tokenize(base, req.content, req.add_special, req.parse_special,
                                     req.with_pieces)
        if req.messages is not None:
            text = base.render_chat(req.messages, req.add_generation_prompt)
            add_special = bool(req.add_special_tokens)
        else:
            text = req.prompt
            add_special = req.add_special_tokens is not False
        tokens = base.encode(text, "messages" if req.messages is not None else "prompt",
                             add_special_tokens=add_special)
        token_strs = base.tokenizer.convert_ids_to_tokens(tokens) if req.return_token_strs \
            else None
        return {"count": len(tokens), "max_model_len": base.max_model_len, "tokens": tokens,
                "token_strs": token_strs}

    @app.get("/tokenizer_info")
    async def show_tokenizer_info() -> dict:
        return tokenizer_info(base.tokenizer, base.chat_template)

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> dict:
        base.check_model(req.model)
        if req.tokens:
            base.check_token_ids(req.tokens, "tokens")
        text = base.tokenizer.decode(req.tokens)
        return {"prompt": text, "content": text}
