"""vLLM's --kv-transfer-config, as minivllm runs it: prefill/decode disaggregation through
the prefix cache's disk tier (model/kv_disk.py) on a folder the instances share.

    --kv-transfer-config '{"kv_connector": "SharedStorageConnector", "kv_role": "kv_producer",
                           "kv_connector_extra_config": {"shared_storage_path": "/dev/shm/kv"}}'

A producer (a prefill instance) writes every block of KV it computes to the folder at once,
before the step's outputs leave the engine; a consumer (a decode instance) finds a
request's blocks there -- written by any instance, at any time -- and loads them instead of
computing them, and keeps its own evicted blocks to itself; kv_both does both. The files
are the disk tier's: named by the blocks' stable keys (core/kv_disk_keys.py), in a folder
per model identity, checksummed and renamed into place whole, so a torn or corrupted
transfer is refused and recomputed, never used. One host (a tmpfs such as /dev/shm: the
bytes through memory) or a shared filesystem.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from minivllm.json_object import json_object

CONNECTORS = ("SharedStorageConnector",)
ROLES = ("kv_producer", "kv_consumer", "kv_both")
_EXAMPLE = ('{"kv_connector": "SharedStorageConnector", "kv_role": "kv_producer", '
            '"kv_connector_extra_config": {"shared_storage_path": "/dev/shm/kv"}}')


@dataclass
class KVTransferConfig:
    kv_connector: str
    kv_role: str
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, value: str | dict | None) -> KVTransferConfig | None:
        if value is None:
            return None
        prefix = "kv_transfer_config (--kv-transfer-config): "
        given = json_object(value, prefix, _EXAMPLE, [f.name for f in cls.__dataclass_fields__
                                                     .values()])
        for key in ("kv_connector", "kv_role"):
            if key not in given:
                raise ValueError(f"{prefix}{key} is required, e.g. {_EXAMPLE}")
        config = cls(**given)
        if config.kv_connector not in CONNECTORS:
            raise ValueError(f"{prefix}unknown kv_connector {config.kv_connector!r}; minivllm "
                             f"runs {', '.join(CONNECTORS)}")
        if config.kv_role not in ROLES:
            raise ValueError(f"{prefix}kv_role must be one of {', '.join(ROLES)}, got "
                             f"{config.kv_role!r}")
        extra = json_object(config.kv_connector_extra_config,
                            f"{prefix}kv_connector_extra_config: ",
                            '{"shared_storage_path": "/dev/shm/kv"}', ["shared_storage_path"])
        path = extra.get("shared_storage_path")
        if not isinstance(path, str) or not path:
            raise ValueError(f"{prefix}{config.kv_connector} needs kv_connector_extra_config's "
                             f"shared_storage_path: the folder the instances share")
        return config

    @property
    def produces(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def consumes(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")

    @property
    def path(self) -> str:
        return self.kv_connector_extra_config["shared_storage_path"]


def parse_kv_transfer_config(value: str | dict | None) -> dict[str, Any] | None:
    """The engine argument's form (a dict, every key filled in), checked."""
    config = KVTransferConfig.parse(value)
    return None if config is None else asdict(config)
