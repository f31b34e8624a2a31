"""Speculative decoding end to end, on the real stories260K model: with `ngram`, `suffix`
and `draft_model` drafts the output is the same tokens as without, greedy and seeded
sampling alike (penalties, n > 1, logprobs, structured outputs) — but for a draft model's
sampled drafts (speculative sampling): the same tokens again for a seed, and the target's
distribution over many seeds —, under prefix caching,
chunked prefill, preemption (swap and recompute) and every policy; drafts are accepted and
rejected (so the comparison exercises both) and no KV block is left behind.

The draft model is built here: stories260K without its last layer (same tokenizer, its own
KV cache shape: 4 layers, not 5), which agrees with the target on about a quarter of its
greedy drafts."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from safetensors.torch import load_file, save_file

from minivllm import LLM, SamplingParams
from minivllm.sampling_params import StructuredOutputsParams
from tests.conftest import assert_all_blocks_free

# Stories repeat themselves: prompt lookup finds drafts in them.
PROMPTS = ["Once upon a time, there was a little girl named Lily. Lily liked to play. "
           "Once upon a time, there was a little",
           "The dog ran to the park. The dog ran to the park. The dog",
           "Tom and Sue", "One day, a big bird"]
# Every draft is verified (the adaptive rule may turn weak ones off: nothing compared).
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
         "prompt_lookup_max": 4, "disable_by_batch_size": None, "adaptive_draft_length": False}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 4, "disable_by_batch_size": None,
          "suffix_decoding_max_spec_factor": 2.0, "adaptive_draft_length": False}
# Every draft is verified, however few pass: the adaptive rule would stop a weak draft model.
DRAFT_MODEL = {"method": "draft_model", "num_speculative_tokens": 3,
               "disable_by_batch_size": None, "adaptive_draft_length": False,
               "prompt_lookup": False}
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=40, seed=7, ignore_eos=True,
                         repetition_penalty=1.1, logprobs=2, n=2)


def run(stories_dir, params, speculative_config=None, **kwargs):
    llm = LLM(model=str(stories_dir), block_size=4, speculative_config=speculative_config,
              **kwargs)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert_all_blocks_free(llm)
    return llm, [[(c.token_ids, c.logprobs) for c in o.outputs] for o in outputs]


def token_ids(outputs):
    return [[ids for ids, _ in request] for request in outputs]


@pytest.fixture(scope="module")
def draft_dir(stories_dir, tmp_path_factory):
    """stories260K's first 4 layers (of 5), its tokenizer files linked."""
    path = tmp_path_factory.mktemp("draft")
    config = json.loads((stories_dir / "config.json").read_text())
    config["num_hidden_layers"] = 4
    (path / "config.json").write_text(json.dumps(config))
    weights = load_file(stories_dir / "model.safetensors")
    save_file({name: w for name, w in weights.items()
               if not name.startswith("model.layers.4.")}, path / "model.safetensors")
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                 "generation_config.json"):
        (path / name).symlink_to(stories_dir / name)
    return path


@pytest.fixture(scope="module", params=["ngram", "suffix", "draft_model"])
def spec(request, draft_dir):
    return {"ngram": NGRAM, "suffix": SUFFIX,
            "draft_model": {**DRAFT_MODEL, "model": str(draft_dir)}}[request.param]


@pytest.fixture(scope="module")
def references(stories_dir):
    return {name: run(stories_dir, params)[1]
            for name, params in (("greedy", GREEDY), ("sampled", SAMPLED))}


@pytest.mark.parametrize("name, params", [("greedy", GREEDY), ("sampled", SAMPLED)])
@pytest.mark.parametrize("engine", [
    {},
    {"enable_prefix_caching": False},
    {"max_num_batched_tokens": 8},  # prompts in chunks, drafts inside a small budget
    {"num_kv_blocks": 24, "preemption_mode": "recompute", "enable_prefix_caching": False},
    {"num_kv_blocks": 24, "preemption_mode": "swap", "swap_space": 0.01},
    {"scheduling_policy": "sjf"},
    {"scheduling_policy": "priority", "max_num_seqs": 2},
])
def test_output_is_the_same_tokens_with_drafts(stories_dir, references, spec, name, params,
                                               engine):
    llm, outputs = run(stories_dir, params, spec, **engine)
    reference = references[name]
    if spec["method"] == "draft_model" and name == "sampled":
        # speculative sampling: distributed as the target's (test_spec_verify.py, and
        # below), and the same tokens again for the same seed and drafts
        reference = run(stories_dir, params, spec, **engine)[1]
    assert token_ids(outputs) == token_ids(reference)
    stats = llm.stats()
    assert stats.spec_num_accepted_tokens > 0, "no draft was accepted: nothing was compared"
    assert stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens, "none rejected"
    if "num_kv_blocks" in engine:
        assert stats.num_preemptions > 0, "the small cache preempted nobody"
    if params.logprobs:  # the target model's, per token
        for request, ref_request in zip(outputs, reference):
            for (_, logprobs), (_, ref_logprobs) in zip(request, ref_request):
                for entry, ref in zip(logprobs, ref_logprobs):
                    assert entry.keys() == ref.keys()
                    for token, logprob in entry.items():
                        assert logprob.logprob == pytest.approx(ref[token].logprob, abs=1e-4)


def test_structured_output_with_drafts_is_the_same(stories_dir, spec):
    params = SamplingParams(temperature=0, max_tokens=30, structured_outputs=(
        StructuredOutputsParams(regex=r"(Once upon a time, )+[a-z ]{0,12}")))
    _, reference = run(stories_dir, params)
    llm, outputs = run(stories_dir, params, spec)
    assert token_ids(outputs) == token_ids(reference)
    assert llm.stats().spec_num_draft_tokens > 0


def test_spec_metrics_and_log_line(stories_dir, caplog):
    from minivllm.core.scheduler_stats import SchedulerStats
    from minivllm.engine.stat_loggers import PrometheusStatLogger, spec_decoding_line

    llm, _ = run(stories_dir, GREEDY, NGRAM)
    stats = llm.stats()
    assert sum(stats.spec_num_accepted_tokens_per_pos) == stats.spec_num_accepted_tokens
    line = spec_decoding_line(stats, SchedulerStats(), 2.0)
    assert line.startswith("SpecDecoding metrics: Mean acceptance length: ")
    assert f"Drafted: {stats.spec_num_draft_tokens} tokens" in line
    prometheus = PrometheusStatLogger("m", 2048)
    from minivllm.engine.stats import IterationStats

    prometheus.record(stats, IterationStats(timestamp=0.0))
    from prometheus_client import generate_latest

    text = generate_latest(prometheus.registry).decode()
    assert (f'vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} '
            f'{float(stats.spec_num_draft_tokens)}') in text
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"}' \
        in text


@pytest.mark.parametrize("engine", [
    {},
    {"num_kv_blocks": 24, "preemption_mode": "recompute", "enable_prefix_caching": False},
    {"num_kv_blocks": 24, "preemption_mode": "swap", "swap_space": 0.01},
    {"max_num_batched_tokens": 8},
    "disk tier",
], ids=["plain", "recompute", "swap", "chunked", "disk-tier"])
def test_the_target_as_its_own_draft_model_has_every_greedy_draft_accepted(
        stories_dir, references, engine, tmp_path):
    """The draft model's KV cache kept whole: with the target as its own draft model, every
    greedy draft is accepted exactly when the draft model's K/V is the target's — caught up
    after a fully accepted draft, cut back after a rejection, swapped out and in with the
    target's, recomputed after a recompute preemption, served by the prefix cache's blocks
    and by its disk tier (a second engine reading the first one's prefixes from disk)."""
    spec = {**DRAFT_MODEL, "model": str(stories_dir)}
    if engine == "disk tier":
        engine = {"kv_offloading_backend": "disk", "kv_offloading_path": str(tmp_path)}
        run(stories_dir, GREEDY, spec, **engine)  # writes the prompts' blocks to disk
    llm, outputs = run(stories_dir, GREEDY, spec, **engine)
    assert token_ids(outputs) == token_ids(references["greedy"])
    stats = llm.stats()
    assert stats.spec_num_accepted_tokens == stats.spec_num_draft_tokens > 0
    if "num_kv_blocks" in engine:
        assert stats.num_preemptions > 0, "the small cache preempted nobody"


def test_draft_model_takes_prompt_lookups_drafts_first(stories_dir, draft_dir, references):
    """With prompt_lookup, a request whose last tokens occurred before verifies prompt
    lookup's drafts (no draft model pass), the others the draft model's: the output is the
    same tokens, and both kinds were verified."""
    llm = LLM(model=str(stories_dir), block_size=4, speculative_config={
        **DRAFT_MODEL, "model": str(draft_dir), "prompt_lookup": True})
    speculation = llm.llm_engine.core.runner.speculation
    kinds = []
    drafts = speculation.drafts

    def recorded(out, *args):
        kinds.extend(d[0] == -1 for d in out.scheduled_spec_decode_tokens.values())
        return drafts(out, *args)

    speculation.drafts = recorded
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [[c.token_ids for c in o.outputs] for o in outputs] == token_ids(references["greedy"])
    assert any(kinds) and not all(kinds), "one kind of drafts only"
    assert_all_blocks_free(llm)


def test_the_draft_model_trusts_no_kv_of_its_rejected_drafts(stories_dir, draft_dir):
    """Past the tokens the target accepted, the draft model's K/V is of rejected drafts: it
    is cut back there at once, so a later step (after steps without drafts, say) runs the
    draft model over the real tokens again, never reads the rejected drafts' K/V."""
    llm = LLM(model=str(stories_dir), block_size=4,
              speculative_config={**DRAFT_MODEL, "model": str(draft_dir)})
    runner = llm.llm_engine.core.runner
    drafter, checked = runner.drafter, []
    verified = drafter.verified

    def checking(req_id, num_computed):
        verified(req_id, num_computed)
        checked.append(drafter.computed.get(req_id, 0) <= num_computed)

    drafter.verified = checking
    llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    stats = llm.stats()
    assert stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens, "none rejected"
    assert checked and all(checked)


def test_a_draft_model_with_another_vocabulary_is_refused_by_name(stories_dir, tmp_path):
    config = json.loads((stories_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": 1000}))
    with pytest.raises(ValueError, match="vocabulary of 1000 tokens, the target 512"):
        LLM(model=str(stories_dir), speculative_config={**DRAFT_MODEL, "model": str(tmp_path)})


def test_drafts_the_grammar_forbids_are_cut_before_the_forward(stories_dir):
    """Prompt lookup proposes the story again, capitals and all, where the regex allows
    lowercase letters only: such drafts are cut at their first forbidden token — unless the
    scheduler skips the grammar, and then they reach the forward pass only to be rejected."""
    prompt = ["Once upon a time, Lily. Once upon a time, Lily. Once upon a time,"]
    params = SamplingParams(temperature=0, max_tokens=20, structured_outputs=(
        StructuredOutputsParams(regex=r"(Once upon a time, )+[a-z ]{0,12}")))
    drafted, cuts, outputs = {}, [], {}
    for check in (True, False):
        llm = LLM(model=str(stories_dir), block_size=4, speculative_config=NGRAM)
        spec_decoding = llm.llm_engine.core.scheduler.spec_decoding
        valid = spec_decoding.valid_drafts

        def spy(req_id, drafts, valid=valid):
            cuts.append((len(drafts), valid(req_id, drafts)))
            return cuts[-1][1]
        spec_decoding.valid_drafts = spy if check else None
        outputs[check] = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
        drafted[check] = llm.stats().spec_num_draft_tokens
    assert any(num_valid < num for num, num_valid in cuts), "no draft was cut"
    assert drafted[True] < drafted[False]
    assert outputs[True] == outputs[False]


def test_a_draft_models_sampled_drafts_keep_the_targets_distribution(stories_dir, draft_dir):
    """Speculative sampling end to end: over 1,500 seeds, the first three tokens (each
    position's own distribution) come out as often with the draft model's sampled drafts as
    without drafts (a two-sample chi-square on the tokens seen at least 10 times), while
    most drafts are kept (more than a deterministic proposal's chance)."""
    prompt, n = "One day, a big bird", 1500
    spec = {**DRAFT_MODEL, "model": str(draft_dir), "num_speculative_tokens": 2}
    counts = []
    for config in (None, spec):
        llm = LLM(model=str(stories_dir), block_size=4, speculative_config=config)
        params = [SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True, seed=s)
                  for s in range(n)]
        outputs = llm.generate([prompt] * n, params, use_tqdm=False)
        counts.append([Counter(o.outputs[0].token_ids[j] for o in outputs) for j in range(3)])
        assert_all_blocks_free(llm)
    stats = llm.stats()
    assert stats.spec_num_accepted_tokens > 0.3 * stats.spec_num_draft_tokens
    for without, with_drafts in zip(*counts):
        tokens = [t for t in without.keys() | with_drafts.keys()
                  if without[t] + with_drafts[t] >= 10]
        chi = sum((without[t] - with_drafts[t]) ** 2 / (without[t] + with_drafts[t])
                  for t in tokens)
        assert chi < chi2_critical(len(tokens) - 1), (chi, len(tokens))


def chi2_critical(df: int) -> float:
    """The chi-square distribution's 0.999 quantile (Wilson-Hilferty; z = 3.09)."""
    return df * (1 - 2 / (9 * df) + 3.09 * (2 / (9 * df)) ** 0.5) ** 3
