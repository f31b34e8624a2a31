"""EngineConfig's sections: the flat engine arguments land in the section that holds them and
read back by their flat names; each policy checks its own options; the engine core runs the
configured scheduler and wires its parts by constructor, not by assignment."""

import dataclasses
import inspect
import re

import pytest

from minivllm.config import ENGINE_ARGS, EngineConfig
from minivllm.core.kv_cache import KVCacheManager
from minivllm.core.kv_disk_connector import DiskConnector
from minivllm.core.policies.vtc import VirtualTokenCounterPolicy
from minivllm.core.policy import POLICIES, PolicyConfig, make_policy
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.scheduler_stats import SchedulerStats


def test_flat_arguments_land_in_their_sections():
    config = EngineConfig(model="m", max_num_seqs=4, scheduling_policy="sjf", swap_space=1.0,
                          num_threads=2, block_size=8)
    assert config.model_config.model == "m" and config.model == "m"
    assert config.scheduler_config.max_num_seqs == 4 and config.max_num_seqs == 4
    assert config.scheduler_config.block_size == 8
    assert config.policy_config.scheduling_policy == "sjf"
    assert config.cache_config.swap_space == 1.0 and config.parallel_config.num_threads == 2
    # None: the engine decides (the model's context; 512 tokens with chunked prefill)
    assert config.max_model_len is None and config.max_num_batched_tokens == 512
    assert EngineConfig(**config.to_kwargs()) == config
    assert set(config.to_kwargs()) == set(ENGINE_ARGS)


def test_a_flat_name_is_read_only_and_an_unknown_one_is_named():
    config = EngineConfig()
    with pytest.raises(AttributeError, match="scheduler_config"):
        config.max_num_seqs = 3
    with pytest.raises(TypeError, match="unknown engine argument.*num_blocks"):
        EngineConfig(num_blocks=5)  # set by the engine from the cache it allocates
    with pytest.raises(AttributeError):
        config.num_blocks  # noqa: B018


def test_runner_and_convert_resolve_as_vllms():
    """vLLM's --runner / --convert: auto serves generation and embeddings; --convert embed
    implies a pooling runner, none a generate one; contradictions and values minivllm does not
    run are refused naming the flag."""
    for kwargs, runner_type in (({}, "auto"), ({"runner": "pooling"}, "pooling"),
                                ({"convert": "embed"}, "pooling"),
                                ({"runner": "pooling", "convert": "embed"}, "pooling"),
                                ({"runner": "generate"}, "generate"),
                                ({"convert": "none"}, "generate")):
        config = EngineConfig(**kwargs)
        assert config.model_config.runner_type == runner_type, kwargs
        assert EngineConfig(**config.to_kwargs()) == config
    for kwargs, why in (({"runner": "draft"}, r"runner \(--runner\) must be one of auto, "
                                              "generate, pooling, got 'draft'"),
                        ({"convert": "reward"}, r"convert \(--convert\) must be one of auto, "
                                                "none, embed"),
                        ({"runner": "generate", "convert": "embed"},
                         "needs --runner pooling or auto"),
                        ({"runner": "pooling", "convert": "none"},
                         "needs --convert embed or auto")):
        with pytest.raises(ValueError, match=why):
            EngineConfig(**kwargs)


def test_a_gguf_file_runs_its_blocks_unless_told_otherwise():
    """quantization unset resolves once, in the config: gguf for a GGUF file (a path or a hub
    'org/repo:QUANT'), nothing for any other model; 'none' is the opt-out that dequantizes.
    The resolved value survives the flat round trip (the CLI's generate rebuilds from it)."""
    for model, resolved in (("m.gguf", "gguf"), ("org/repo:Q4_K_M", "gguf"),
                            ("org/repo", None), ("minivllm-demo", None)):
        config = EngineConfig(model=model)
        assert config.quantization == resolved, model
        assert EngineConfig(**config.to_kwargs()) == config
    for quantization in ("none", "int8", "gguf"):
        config = EngineConfig(model="m.gguf", quantization=quantization)
        assert config.quantization == quantization
        assert EngineConfig(**config.to_kwargs()).quantization == quantization
    assert EngineConfig(model="m.gguf", dtype="bfloat16").quantization == "gguf"
    assert EngineConfig(quantization="none", dtype="float16").quantization == "none"
    for kwargs, why in (({"quantization": "q4"}, r"quantization \(--quantization\) must be "
                                                 "none, int8 or gguf .*got 'q4'"),
                        ({"quantization": "gguf"}, "must be a .gguf file.*'minivllm-demo'"),
                        ({"model": "m.gguf", "dtype": "float16"},
                         "dtype='float16' with quantization='gguf'.*--quantization none "
                         "--dtype float16"),
                        ({"quantization": "int8", "dtype": "bfloat16"},
                         "dtype must be auto or float32, got 'bfloat16'")):
        with pytest.raises(ValueError, match=why):
            EngineConfig(**kwargs)


def test_every_policy_option_is_a_setting_its_policy_checks():
    names = {f.name for f in dataclasses.fields(PolicyConfig)}
    for cls in POLICIES.values():
        assert set(cls.option_names) <= names, cls.name
    # vtc's weights are checked whichever policy runs, by vtc
    with pytest.raises(ValueError, match="vtc_weights"):
        PolicyConfig(scheduling_policy="fcfs", vtc_weights="1")
    with pytest.raises(ValueError, match="vtc_weights"):
        VirtualTokenCounterPolicy.validate_options(vtc_weights="0,1")
    policy = PolicyConfig(scheduling_policy="mlfq", mlfq_base_quantum=3).make_policy()
    assert policy.name == "mlfq" and policy.base_quantum == 3


def test_scheduler_stats_are_scheduler_stats_fields():
    """Scheduler.stats() is the typed SchedulerStats with every field set by name (none left
    to its default by omission): its own, and the KV cache's and disk tier's, which it
    spreads in as dicts keyed by the field names."""
    scheduler = Scheduler(SchedulerConfig(num_blocks=8, block_size=4), make_policy("fcfs"))
    stats = scheduler.stats()
    assert type(stats) is SchedulerStats
    assert stats.num_total_blocks == 8 and stats.num_free_blocks == 8
    named = set(re.findall(r"(\w+)=", inspect.getsource(Scheduler.stats)))
    for part in (KVCacheManager.stats, DiskConnector.stats):
        named |= set(re.findall(r'"(\w+)":', inspect.getsource(part)))
    assert named == {f.name for f in dataclasses.fields(SchedulerStats)}


def test_the_policy_learns_the_cache_and_budget_from_its_scheduler():
    policy = make_policy("sjf")
    scheduler = Scheduler(SchedulerConfig(num_blocks=8, block_size=4,
                                          max_num_batched_tokens=24), policy)
    assert policy.token_budget == 24
    assert policy.cached_tokens == scheduler.kv.num_cached_tokens_probe


def test_the_engine_core_runs_the_configured_scheduler(tiny_llama):
    from minivllm.engine.core import EngineCore

    config = EngineConfig(model=str(tiny_llama), num_kv_blocks=16, max_num_seqs=3,
                          preemption_victim="least_work_done", scheduling_policy="vtc",
                          swap_space=0.001)
    core = EngineCore(config)
    assert core.scheduler.config == dataclasses.replace(
        config.scheduler_config, num_blocks=16, num_swap_blocks=core.runner.num_swap_blocks,
        max_model_len=core.max_model_len)
    assert core.scheduler.policy.name == "vtc"
    assert core.runner.sampler.structured is core.structured
