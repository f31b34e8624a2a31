"""GET /api/tags, POST /api/show and GET /api/ps: the served model (and its LoRA adapters)
as Ollama describes its models, from the model's card (model_card.py, read once, off the
event loop) and the server's own settings: its chat template, sampling defaults, context
length and parsers."""

from __future__ import annotations

import asyncio
import json

from minivllm.entrypoints.ollama.model_card import ModelCard, read_card

# Ollama's option names of the generation-config defaults (engine/generation_defaults.py)
PARAMETER_NAMES = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
                   "min_p": "min_p", "repetition_penalty": "repeat_penalty",
                   "max_tokens": "num_predict"}
# /api/ps: the model stays loaded while the server runs (keep_alive changes nothing)
NEVER = "9999-12-31T23:59:59Z"


class OllamaServingModels:
    def __init__(self, engine, base, chat, models) -> None:
        self.engine, self.base, self.chat, self.models = engine, base, chat, models
        self._card: asyncio.Future | None = None

    def served(self) -> list[str]:
        adapters = list(self.models.lora_requests) if self.models is not None else []
        return [self.base.model_name, *adapters]

    async def card(self) -> ModelCard:
        if self._card is None:  # one read, shared by the requests that wait for it
            config = self.engine.config
            self._card = asyncio.ensure_future(
                asyncio.to_thread(read_card, config.model, config.revision))
        return await asyncio.shield(self._card)

    async def _entries(self) -> list[dict]:
        card = await self.card()
        entries = []
        for name in self.served():
            parent = "" if name == self.base.model_name else self.base.model_name
            entries.append({"name": name, "model": name, "modified_at": card.modified_at,
                            "size": card.size, "digest": card.digest,
                            "details": card.details(parent)})
        return entries

    async def tags(self) -> dict:
        return {"models": await self._entries()}

    async def ps(self) -> dict:
        entries = await self._entries()
        for entry in entries:
            # a CPU engine holds nothing in a GPU's memory
            entry.update(expires_at=NEVER, size_vram=0,
                         context_length=self.engine.max_model_len)
        return {"models": entries}

    async def show(self, name: str, verbose: bool) -> dict:
        card = await self.card()
        parent = "" if name == self.base.model_name else self.base.model_name
        template = self.base.chat_template or self.base.tokenizer.chat_template or ""
        if not isinstance(template, str):  # a tokenizer's named templates
            template = json.dumps(template)
        parameters = self._parameters()
        modelfile = "\n".join([f"# Modelfile of minivllm's {name}", f"FROM {card.path}",
                               *(f"PARAMETER {p}" for p in parameters)])
        return {"modelfile": modelfile, "parameters": "\n".join(parameters),
                "template": template, "details": card.details(parent),
                "model_info": card.model_info_verbose if verbose else card.model_info,
                "capabilities": self._capabilities(), "modified_at": card.modified_at}

    def _parameters(self) -> list[str]:
        """The server's defaults as Ollama's `name value` lines (the template is Jinja, a
        chat template, not Ollama's Go template: it is not a Modelfile TEMPLATE)."""
        lines = [f"{'num_ctx':<30} {self.engine.max_model_len}"]
        for key, value in self.base.default_sampling.items():
            if key in PARAMETER_NAMES:
                lines.append(f"{PARAMETER_NAMES[key]:<30} {json.dumps(value)}")
        return lines

    def _capabilities(self) -> list[str]:
        runner = self.engine.config.model_config.runner_type
        found = [] if runner == "pooling" else ["completion"]
        if runner != "generate":
            found.append("embedding")
        if self.chat.tool_parser is not None:
            found.append("tools")
        if self.chat.reasoning_parser is not None:
            found.append("thinking")
        return found
