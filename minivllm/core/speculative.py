"""Speculative decoding in the scheduler: what to propose, how much, and what was accepted.

A running request that decodes may carry draft tokens into a step: it then computes its last
token and the drafts (1 + k tokens, counted in the step's token budget, with KV slots), the
runner verifies the drafts against the target model's own samples (model/spec_verify.py)
and returns the tokens it accepted plus one of the target's. The scheduler rolls the
request's computed count back past the rejected drafts and frees the blocks only they
needed (Scheduler.update_from_output).

`ngram` (prompt lookup, vLLM's method of that name): find the request's last n tokens
(n from prompt_lookup_max down to prompt_lookup_min) earlier in its prompt and output, and
propose the tokens that followed the latest such occurrence. Pure token arithmetic, so it
lives here, beside the token ids, and the simulator runs it too. `suffix` and
`draft_model`: core/draft_proposers.py.

Where it does not pay it is turned off: above disable_by_batch_size running requests (a
large batch is compute-bound: verifying drafts only adds work), and per request by the
adaptive draft length: the k that maximizes expected tokens per second, given the request's
running acceptance and what a verification row costs on this machine (measured by the
scheduler, core/spec_decoding.py). A request whose drafts do not pay proposes none, and
probes again now and then.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from minivllm.json_object import json_object

METHODS = ("ngram", "suffix", "draft_model")
# The methods vLLM has that minivllm does not run yet: named in the refusal.
_NOT_YET = ("eagle", "eagle3", "mtp", "medusa")


@dataclass
class SpeculativeConfig:
    """vLLM's --speculative-config keys that minivllm reads."""

    method: str = "ngram"
    num_speculative_tokens: int = 3
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    disable_by_batch_size: int | None = 8  # no drafts while more requests than this run
    # The adaptive draft length (minivllm's, best_draft_length): false: every decoding request
    # drafts num_speculative_tokens, whatever they cost.
    adaptive_draft_length: bool = True
    # suffix (core/suffix_tree.py), vLLM's keys. The cache of finished requests' outputs is
    # smaller than vLLM's 10000 by default: a cached output token costs about depth tree
    # nodes of ~200 bytes each in Python.
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 256
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    # draft_model: the drafting model's directory (same tokenizer as the target).
    model: str | None = None
    # draft_model (minivllm's): prompt lookup's drafts first, where the request's last tokens
    # occurred before (free: no draft model pass); the draft model's elsewhere.
    prompt_lookup: bool = True

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"speculative_config: {name} {why}, got {getattr(self, name)!r}")

        if self.method in _NOT_YET:
            raise bad("method", f"is not implemented in minivllm yet (it runs: "
                                f"{', '.join(METHODS)})")
        if self.method not in METHODS:
            raise bad("method", f"must be one of {', '.join(METHODS)}")
        if not isinstance(self.num_speculative_tokens, int) or not (
                1 <= self.num_speculative_tokens <= 16):
            raise bad("num_speculative_tokens", "must be an integer in [1, 16]")
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise bad(name, "must be an integer >= 1")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise bad("prompt_lookup_min", f"must be <= prompt_lookup_max "
                                           f"({self.prompt_lookup_max})")
        if self.disable_by_batch_size is not None and (
                not isinstance(self.disable_by_batch_size, int) or self.disable_by_batch_size < 1):
            raise bad("disable_by_batch_size", "must be an integer >= 1 (or null: never)")
        for name in ("adaptive_draft_length", "prompt_lookup"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "must be true or false")
        if not isinstance(self.suffix_decoding_max_tree_depth, int) or not (
                2 <= self.suffix_decoding_max_tree_depth <= 256):
            raise bad("suffix_decoding_max_tree_depth", "must be an integer in [2, 256]")
        if not isinstance(self.suffix_decoding_max_cached_requests, int) or (
                self.suffix_decoding_max_cached_requests < 0):
            raise bad("suffix_decoding_max_cached_requests", "must be an integer >= 0")
        if not self.suffix_decoding_max_spec_factor > 0:
            raise bad("suffix_decoding_max_spec_factor", "must be > 0")
        if not 0.0 <= self.suffix_decoding_min_token_prob <= 1.0:
            raise bad("suffix_decoding_min_token_prob", "must be in [0, 1]")
        if (self.method == "draft_model") != (self.model is not None):
            raise bad("model", "must name the draft model's directory with method "
                               "draft_model, and only then")

    @classmethod
    def parse(cls, value: str | dict | None) -> SpeculativeConfig | None:
        """The flag's JSON (or a dict, as LLM(speculative_config=...) takes it); a ValueError
        names bad JSON, unknown keys and bad values."""
        if value is None:
            return None
        value = json_object(value, "speculative_config: ",
                            '{"method": "ngram", "num_speculative_tokens": 3}',
                            sorted(cls.__dataclass_fields__))
        return cls(**value)


def parse_speculative_config(value: str | dict | None) -> dict[str, Any] | None:
    """The engine argument's form (a dict, every key filled in), checked."""
    config = SpeculativeConfig.parse(value)
    return None if config is None else asdict(config)


def ngram_propose(token_ids: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the sequence's last n
    tokens, trying the longest n first; [] when none occurs. (Plain lists: core/ imports
    neither torch nor numpy.)"""
    num = len(token_ids)
    if k <= 0 or num < n_min + 1:
        return []
    for n in range(min(n_max, num - 1), n_min - 1, -1):
        suffix, first = token_ids[num - n:], token_ids[num - n]
        for start in range(num - n - 1, -1, -1):  # latest first, not overlapping the end
            if token_ids[start] == first and token_ids[start:start + n] == suffix:
                return list(token_ids[start + n:start + n + k])
    return []


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a verification of k drafts yields (the accepted drafts and the target's own)
    when each draft is accepted with probability `acceptance` once the ones before it were:
    1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)."""
    return sum(acceptance ** i for i in range(k + 1))


# The gain a draft length must promise over none: what the step-time fit cannot see (its
# noise; a draft model's first pass over a new prompt, its catch-up after steps without
# drafts) is paid anyway.
DRAFT_MARGIN = 0.05


def best_draft_length(acceptance: float, max_k: int, row_cost: float) -> int:
    """The draft length in [0, max_k] with the most tokens per second: expected_tokens over
    the step's cost, 1 + row_cost x k (row_cost: what one more row adds to the step, as a
    fraction of the step without drafts). The shortest of equals; 0 unless the best
    promises DRAFT_MARGIN more than no drafts."""
    def rate(k: int) -> float:
        return expected_tokens(acceptance, k) / (1 + row_cost * k)

    k = max(range(max_k + 1), key=lambda k: (rate(k), -k))
    return k if rate(k) >= 1 + DRAFT_MARGIN else 0


@dataclass
class DraftTracker:
    """One request's acceptance: the chance a draft is accepted once the drafts before it
    were, estimated as its accepted drafts over the drafts verified up to the first rejected
    one, both exponential averages over its verifications."""

    accepted: float = 1.0  # optimistic: a new request starts at acceptance 1
    tried: float = 1.0
    skipped: int = 0  # steps without drafts since they stopped paying
    # Probe while off: not a draft model's (a probe would first run it over every token
    # since its last draft: a prefill, where drafts are free to look up)
    probes: bool = True

    @property
    def acceptance(self) -> float:
        return self.accepted / self.tried

    def draft_length(self, max_k: int, row_cost: float) -> int:
        k = best_draft_length(self.acceptance, max_k, row_cost)
        if k == 0:
            if not self.probes:
                return 0
            # Off, but probe with one token every 16 steps: the text may start repeating.
            self.skipped += 1
            if self.skipped < 16:
                return 0
            self.skipped = 0
            return 1
        return k

    def record(self, num_drafted: int, num_accepted: int, forget: float = 0.7) -> None:
        if num_drafted:
            rejected = num_accepted < num_drafted  # the first rejected one was tried too
            self.accepted = forget * self.accepted + num_accepted
            self.tried = forget * self.tried + num_accepted + rejected


@dataclass
class SpecDecodingStats:
    """Cumulative counters, by vLLM's names (vllm:spec_decode_*)."""

    num_drafts: int = 0  # verifications: steps in which a request carried drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # Accepted drafts by their position in the draft (0: the first).
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        if len(self.num_accepted_tokens_per_pos) < num_drafted:
            self.num_accepted_tokens_per_pos.extend(
                [0] * (num_drafted - len(self.num_accepted_tokens_per_pos)))
        for pos in range(num_accepted):
            self.num_accepted_tokens_per_pos[pos] += 1
