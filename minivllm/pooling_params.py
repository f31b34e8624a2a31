"""PoolingParams and the pooler config (--pooler-config), spelled like vLLM's: how a pooling
request turns its prompt's final-norm hidden states into one vector.

A pooling request is a request with no decode steps: its prompt is prefilled (in chunks or
not) and the runner pools the hidden states (model/pooler.py). LAST takes the last prompt
token's, MEAN averages every prompt position's; `normalize` scales the vector to unit L2
norm. vLLM's defaults for an embedding task on a decoder model: LAST, normalized.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from minivllm.json_object import json_object

POOLING_TYPES = ("LAST", "MEAN")
# vLLM's embed pooler for decoder models, what --pooler-config leaves unset.
DEFAULT_POOLER_CONFIG = {"pooling_type": "LAST", "normalize": True}


@dataclass
class PoolingParams:
    """Per request. None fields take the engine's --pooler-config."""

    # OpenAI's `dimensions`: keep the first this many values (then normalize, as OpenAI
    # does for shortened embeddings), at most the model's hidden size (the core checks it).
    dimensions: int | None = None
    normalize: bool | None = None
    pooling_type: str | None = None

    def __post_init__(self) -> None:
        if self.dimensions is not None and (
                not isinstance(self.dimensions, int) or isinstance(self.dimensions, bool)
                or self.dimensions < 1):
            raise ValueError(f"dimensions must be an integer >= 1, got {self.dimensions!r}")
        if self.pooling_type is not None and self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type must be one of {', '.join(POOLING_TYPES)}, got "
                             f"{self.pooling_type!r}")

    def resolve(self, pooler_config: dict[str, Any] | None) -> PoolingParams:
        """These params with every unset field taken from the pooler config (or vLLM's
        defaults)."""
        config = {**DEFAULT_POOLER_CONFIG, **(pooler_config or {})}
        return dataclasses.replace(
            self, pooling_type=self.pooling_type or config["pooling_type"],
            normalize=config["normalize"] if self.normalize is None else self.normalize)


def parse_pooler_config(value: str | dict | None, flag: str | None = "pooler_config"
                        ) -> dict[str, Any] | None:
    """--pooler-config: a JSON object such as '{"pooling_type": "MEAN", "normalize": true}'.
    A ValueError starting with `flag` (None: no prefix, for argparse, which names the flag)."""
    if value is None:
        return None
    prefix = f"{flag}: " if flag else ""
    value = json_object(value, prefix, '{"pooling_type": "MEAN"}', DEFAULT_POOLER_CONFIG)
    if not isinstance(value.get("normalize", True), bool):
        raise ValueError(f"{prefix}normalize must be true or false, got {value['normalize']!r}")
    try:
        PoolingParams(pooling_type=value.get("pooling_type"))
    except ValueError as e:
        raise ValueError(prefix + str(e)) from None
    return dict(value)
