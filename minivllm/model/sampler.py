"""Sampling: penalties, min_tokens, temperature, top-k / top-p / min-p, per-request seeds,
and logprobs of the model's raw distribution (before any of those adjustments, as vLLM).

The Sampler keeps each request's state between steps: its RNG key, its output position and
its penalty bookkeeping (the prompt+output tokens, the output tokens' counts), updated as
tokens are sampled, never rebuilt. Two paths sample a batch, with the same semantics and the
same arithmetic where it decides a token, so they agree token for token (up to rounding in
exp and sums, see tests/model/test_sampler.py): the fused C kernel (kernels/sampler.c) and the
batched torch path below, its reference and the fallback where the kernels cannot run.

Semantics (vLLM's), per row: repetition penalty over prompt+output tokens (positive logits
divided, others multiplied), frequency * count + presence subtracted over output tokens,
tokens banned until min_tokens; temperature 0 (below 1e-5, as vLLM) is greedy: the first
argmax. Otherwise every filter is a threshold on the penalized logit y, ties kept together:
top-k keeps y >= the k-th largest; top-p keeps a token iff the mass of the tokens with a
strictly larger y (within top-k) is < top_p, so the token crossing top_p is kept; min-p
keeps (y - max) / T >= log(min_p). The draw is from the softmax of y / T over what is kept.

The draw is an inverse CDF over the kept tokens in token-id order with one uniform u per
row, u = hash(request key, output position) (splitmix64, same arithmetic here and in C).
Why not Gumbel-max: it needs one random number (a hash and two logs) per token, over the
whole vocabulary; the inverse CDF needs one per row and a pass over the kept tokens.
Since u depends only on the request and its position, a request samples the same tokens
alone or in any batch, and across preemption (its state stays here until it is removed).

Constrained decoding: a request with structured_outputs has a grammar matcher here. Before
anything else, its row's logits get -inf wherever its grammar forbids the next token (as a
min_tokens ban: greedy and sampled rows alike, rows without a constraint untouched), and
the matcher then advances with the sampled token. EOS is allowed only where the grammar
accepts. In JSON, a number is ended once it has 20 digits, where the grammar allows it
(structured_output/number_guard.py). A preempted request keeps its matcher here (a recompute re-runs the model over its
tokens, not the sampler); a request added again gets a fresh matcher advanced over its
output so far, so the grammar resumes where it was either way.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from minivllm.model.kernels import library, sampler_ops
from minivllm.outputs import Logprob
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output.manager import (
    StructuredOutputManager,
    apply_bitmask,
    fill_bitmask,
)
from minivllm.structured_output.number_guard import JSON_KINDS, JsonNumberGuard

logger = logging.getLogger(__name__)

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_GREEDY_EPS = 1e-5  # temperatures below this are greedy, as vLLM's
# A disabled threshold: the C side's -FLT_MAX (finite, as the kernel is built with
# -ffast-math). "y >= _NO_LIMIT" still excludes banned (-inf) tokens.
_NO_LIMIT = torch.finfo(torch.float32).min
_EMPTY_IDS = np.zeros(0, dtype=np.int32)
_EMPTY_DELTAS = np.zeros(0, dtype=np.float32)
_EMPTY_PENALTIES = (_EMPTY_IDS, _EMPTY_DELTAS)


def _mix64(z: int) -> int:
    """splitmix64's finalizer (sampler.c's mix64)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def request_key(seed: int) -> int:
    """A request's 64-bit RNG key from its seed (any int): splitmix64's first output."""
    return _mix64((seed + _GOLDEN) & _MASK)


def uniform(key: int, position: int) -> float:
    """The uniform in [0, 1) of the token at output `position` (sampler.c's uniform)."""
    return (_mix64((key + (position + 1) * _GOLDEN) & _MASK) >> 11) * 2.0 ** -53


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row, in the order of req_ids
    logprobs: list[dict[int, Logprob] | None]  # per row, when its params.logprobs is set


def batch_top_logprobs(logprobs: torch.Tensor, token_ids: list[int],
                       nums: list[int]) -> list[dict[int, Logprob]]:
    """Per row of logprobs [R, V]: its chosen token's logprob and rank (1 + the number of
    tokens with a strictly larger logprob), plus its nums[i] most likely tokens."""
    chosen_ids = torch.tensor(token_ids, device=logprobs.device).unsqueeze(1)
    chosen = logprobs.gather(1, chosen_ids)
    ranks = ((logprobs > chosen).sum(1) + 1).tolist()
    nums = [min(n, logprobs.shape[1]) for n in nums]
    top = max(nums)
    values, ids = logprobs.topk(top, dim=1) if top else (None, None)
    values, ids = (values.tolist(), ids.tolist()) if top else ([], [])
    results = []
    for i, (token_id, value, rank) in enumerate(zip(token_ids, chosen.squeeze(1).tolist(),
                                                    ranks)):
        result = {token_id: Logprob(value, rank)}
        for r in range(nums[i]):
            result.setdefault(ids[i][r], Logprob(values[i][r], r + 1))
        results.append(result)
    return results


def top_logprobs(logprobs: torch.Tensor, token_id: int, num: int) -> dict[int, Logprob]:
    """The chosen token's logprob and rank, plus the `num` most likely tokens."""
    return batch_top_logprobs(logprobs.unsqueeze(0), [token_id], [num])[0]


def _doubled(a: np.ndarray) -> np.ndarray:
    return np.concatenate([a, np.zeros_like(a)])


class _RequestState:
    """One request's sampling parameters and its state, updated by `append`."""

    def __init__(self, params: SamplingParams, vocab_size: int, prompt: list[int],
                 output: list[int], banned: Iterable[int], seed: int) -> None:
        self.params, self.seed = params, seed
        key = request_key(seed)
        self.key = key - (1 << 64) if key >= 1 << 63 else key  # as a signed int64
        self.position = len(output)
        self.greedy = params.temperature < _GREEDY_EPS
        self.top_k = params.top_k if 0 < params.top_k < vocab_size else 0
        rep = params.repetition_penalty
        self.fparams = (0.0 if self.greedy else 1.0 / params.temperature, params.top_p,
                        math.log(params.min_p) if params.min_p > 0 else _NO_LIMIT,
                        rep, 1.0 / rep)

        def valid(ids: Iterable[int]) -> np.ndarray:  # sorted, unique, inside the vocabulary
            a = np.unique(np.fromiter(ids, dtype=np.int64))
            return a[(a >= 0) & (a < vocab_size)].astype(np.int32)

        # Repetition penalty: the distinct prompt+output tokens, in seen_ids[:num_seen],
        # and a bitmap of them (bit t of byte t // 8) to tell a new token.
        self.num_seen, self.tracks_seen = 0, rep != 1.0
        if self.tracks_seen:
            self.seen_ids = valid([*prompt, *output])
            self.num_seen = len(self.seen_ids)
            self.seen_ids = np.concatenate([self.seen_ids, np.zeros(16, dtype=np.int32)])
            bits = np.zeros(vocab_size, dtype=bool)
            bits[self.seen_ids[:self.num_seen]] = True
            self.seen_bits = bytearray(np.packbits(bits, bitorder="little").tobytes())
        # Frequency/presence penalties: output token -> slot in out_ids/counts/deltas.
        self.slots: dict[int, int] | None = None
        if params.frequency_penalty or params.presence_penalty:
            self.slots = {}
            self.out_ids = np.zeros(16, dtype=np.int32)
            self.counts = np.zeros(16, dtype=np.int32)
            self.deltas = np.zeros(16, dtype=np.float32)
            for token in output:
                self._count(token)
        self.banned = valid(banned) if params.min_tokens else _EMPTY_IDS
        self.matcher = None  # the grammar's matcher (llguidance), with structured_outputs
        self.number_guard: JsonNumberGuard | None = None  # with a JSON constraint

    def seen(self) -> np.ndarray:
        return self.seen_ids[:self.num_seen] if self.num_seen else _EMPTY_IDS

    def bans(self) -> np.ndarray:
        return self.banned if self.position < self.params.min_tokens else _EMPTY_IDS

    def plain_greedy(self) -> bool:
        return self.greedy and not self.num_seen and not self.slots and not len(self.bans())

    def penalties(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.slots:
            return _EMPTY_IDS, _EMPTY_DELTAS
        n = len(self.slots)
        return self.out_ids[:n], self.deltas[:n]

    def _count(self, token: int) -> None:
        slot = self.slots.get(token)
        if slot is None:
            slot = self.slots[token] = len(self.slots)
            if slot == len(self.out_ids):
                self.out_ids, self.counts, self.deltas = (
                    _doubled(self.out_ids), _doubled(self.counts), _doubled(self.deltas))
            self.out_ids[slot] = token
        self.counts[slot] += 1
        p = self.params
        self.deltas[slot] = p.frequency_penalty * int(self.counts[slot]) + p.presence_penalty

    def append(self, token: int) -> None:
        """Record a sampled token: one more output position, penalty state updated."""
        self.position += 1
        if self.tracks_seen and not self.seen_bits[token >> 3] >> (token & 7) & 1:
            self.seen_bits[token >> 3] |= 1 << (token & 7)
            if self.num_seen == len(self.seen_ids):
                self.seen_ids = _doubled(self.seen_ids)
            self.seen_ids[self.num_seen] = token
            self.num_seen += 1
        if self.slots is not None:
            self._count(token)


def _csr(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Row offsets [len + 1] (int64) and the concatenated arrays."""
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    return offsets, np.concatenate(arrays)


@dataclass
class _Batch:
    """The rows' parameters and penalty state, packed for the kernel and the torch path."""

    fparams: torch.Tensor  # [N, 5] fp32: 1 / temperature (0: greedy), top_p, log(min_p),
    #                        repetition penalty and its inverse
    iparams: torch.Tensor  # [N, 3] int64: top_k (0: off), RNG key, output position
    seen: tuple[np.ndarray, np.ndarray]  # offsets, prompt+output tokens (repetition)
    penalties: tuple[np.ndarray, np.ndarray, np.ndarray]  # offsets, output tokens, deltas
    bans: tuple[np.ndarray, np.ndarray]  # offsets, tokens banned this step


def _pack(states: list[_RequestState], plain: bool = False) -> _Batch:
    """plain: the rows' temperature and filters only, none of their penalties or bans."""
    pens = [_EMPTY_PENALTIES if plain else s.penalties() for s in states]
    pen_offsets, pen_ids = _csr([ids for ids, _ in pens])
    return _Batch(
        torch.tensor([s.fparams for s in states], dtype=torch.float32),
        torch.tensor([(s.top_k, s.key, s.position) for s in states], dtype=torch.int64),
        _csr([_EMPTY_IDS if plain else s.seen() for s in states]),
        (pen_offsets, pen_ids, np.concatenate([deltas for _, deltas in pens])),
        _csr([_EMPTY_IDS if plain else s.bans() for s in states]))


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device, seed: int,
                 use_kernel: bool, structured: StructuredOutputManager | None = None) -> None:
        self.vocab_size, self.device = vocab_size, torch.device(device)
        self.use_kernel = use_kernel and library.available(self.device, torch.float32)
        self.generator = torch.Generator().manual_seed(seed)  # the seeds of unseeded requests
        self._requests: dict[str, _RequestState] = {}
        # Compiles the grammars of structured_outputs requests (the engine core's).
        self.structured = structured

    def add_request(self, req_id: str, params: SamplingParams, prompt_token_ids: list[int],
                    output_token_ids: list[int], banned_until_min_tokens: Iterable[int],
                    seed: int | None) -> None:
        """Adding an id again replaces its state; with seed None it keeps its seed, so a
        re-added request continues its random stream (from len(output_token_ids))."""
        if seed is None:
            old = self._requests.get(req_id)
            seed = old.seed if old is not None else int(
                torch.randint(1 << 62, (), generator=self.generator))
        state = _RequestState(params, self.vocab_size, prompt_token_ids, output_token_ids,
                              banned_until_min_tokens, seed)
        if params.structured_outputs is not None:
            state.matcher = self.structured.new_matcher(params.structured_outputs)
            if output_token_ids and not state.matcher.consume_tokens(output_token_ids):
                raise RuntimeError(f"request {req_id}: its output so far does not match its "
                                   f"grammar: {state.matcher.get_error()}")
            if params.structured_outputs.kind in JSON_KINDS:
                state.number_guard = JsonNumberGuard(self.structured.number_guard_tables())
                for token in output_token_ids:
                    state.number_guard.consume(token)
        self._requests[req_id] = state

    def remove_request(self, req_id: str) -> None:
        self._requests.pop(req_id, None)

    def num_valid_drafts(self, req_id: str, draft_token_ids: list[int]) -> int:
        """How many leading draft tokens the request's grammar accepts from where it is (all
        of them without structured_outputs): the scheduler drafts no further (speculative
        decoding), as a token the grammar forbids could only be rejected."""
        state = self._requests.get(req_id)
        if state is None or state.matcher is None:
            return len(draft_token_ids)
        return state.matcher.validate_tokens(draft_token_ids)

    def sample(self, logits: torch.Tensor, req_ids: list[str]) -> SamplerOutput:
        """logits: [N, vocab] fp32, row i for req_ids[i]. Samples one token per row and
        records it in the request's state."""
        if logits.shape[-1] != self.vocab_size:  # token ids index the rows: must fit
            raise ValueError(f"logits have {logits.shape[-1]} columns, the vocabulary "
                             f"{self.vocab_size} tokens")
        states = [self._requests[r] for r in req_ids]
        logits = self._constrain(logits, states)
        kernel = self.use_kernel and logits.device.type == "cpu" and logits.dtype == torch.float32
        if kernel:
            logits = logits.contiguous()
        if all(s.plain_greedy() for s in states):  # one argmax for the whole batch
            tokens = sampler_ops.argmax(logits) if kernel else logits.argmax(dim=-1)
        else:
            batch = _pack(states)
            if kernel:
                tokens = sampler_ops.sample_rows(logits, batch.fparams, batch.iparams, batch.seen,
                                                 batch.penalties, batch.bans)
            else:
                tokens = _sample_torch(logits, states, batch)
        token_ids = tokens.tolist()
        logprobs: list[dict[int, Logprob] | None] = [None] * len(states)
        wanted = [i for i, s in enumerate(states) if s.params.logprobs is not None]
        if wanted:  # from the raw distribution, all rows at once
            rows = logits[torch.tensor(wanted, device=logits.device)].float()
            found = batch_top_logprobs(torch.log_softmax(rows, dim=-1),
                                       [token_ids[i] for i in wanted],
                                       [states[i].params.logprobs for i in wanted])
            for i, result in zip(wanted, found):
                logprobs[i] = result
        for state, token in zip(states, token_ids):
            _advance(state, token)
        return SamplerOutput(token_ids, logprobs)

    def _constrain(self, logits: torch.Tensor, states: list[_RequestState]) -> torch.Tensor:
        """-inf where a row's grammar forbids the next token (rows without one untouched)."""
        constrained = [i for i, s in enumerate(states) if s.matcher is not None]
        if not constrained:
            return logits
        allowed = fill_bitmask([states[i].matcher for i in constrained], self.vocab_size)
        for row, i in enumerate(constrained):
            if states[i].number_guard is not None:
                states[i].number_guard.restrict(allowed[row])
        return apply_bitmask(logits, constrained, allowed)

    # ---- speculative sampling (model/spec_verify.py) ----------------------------------

    def probabilities(self, logits: torch.Tensor, req_ids: list[str],
                      own_state: bool = True) -> torch.Tensor:
        """[N, V] float64: the distribution row i's request samples its next token from:
        its grammar, penalties and bans (own_state; False: none of them, as a draft model
        proposes) then its temperature and filters. A greedy request's is its argmax's."""
        states = [self._requests[r] for r in req_ids]
        y = self._constrain(logits, states) if own_state else logits
        y = _penalize(y.float(), _pack(states, plain=not own_state))
        probs = torch.zeros(y.shape, dtype=torch.float64, device=y.device)
        greedy = [i for i, s in enumerate(states) if s.greedy]
        if greedy:
            index = torch.tensor(greedy, device=y.device)
            probs[index, y[index].argmax(dim=-1)] = 1.0
        rows = [i for i, s in enumerate(states) if not s.greedy]
        if rows:
            index = torch.tensor(rows, device=y.device)
            batch = _pack([states[i] for i in rows], plain=True)
            mass = _kept_mass(y[index], [states[i] for i in rows], batch.fparams.to(y.device),
                              batch.iparams.to(y.device)).double()
            probs[index] = mass / mass.sum(dim=1, keepdim=True)
        return probs

    def is_greedy(self, req_id: str) -> bool:
        return self._requests[req_id].greedy

    def uniforms(self, req_ids: list[str], stream: int, ahead: int = 0) -> torch.Tensor:
        """Each request's uniform of the given stream (0: the one sample() draws with) at
        its output position + ahead: a function of its seed and that position alone."""
        values = []
        for req_id in req_ids:
            state = self._requests[req_id]
            key = state.key & _MASK
            if stream:
                key = _mix64((key ^ (stream * _GOLDEN)) & _MASK)
            values.append(uniform(key, state.position + ahead))
        return torch.tensor(values, dtype=torch.float64)

    def record(self, req_id: str, token: int, raw_logits: torch.Tensor) -> dict | None:
        """A token chosen for the request outside sample() (speculative sampling's): its
        state advances as sample() advances it; its logprobs (from the raw logits row) if it
        asked for them."""
        state = self._requests[req_id]
        logprobs = None
        if state.params.logprobs is not None:
            logprobs = top_logprobs(torch.log_softmax(raw_logits.float(), dim=-1), token,
                                    state.params.logprobs)
        _advance(state, token)
        return logprobs


def _advance(state: _RequestState, token: int) -> None:
    """The request's state after it samples `token`: position, penalties, grammar."""
    state.append(token)
    if state.number_guard is not None:
        state.number_guard.consume(token)
    # Only when every allowed token was also banned (min_tokens against a finished grammar):
    # the matcher stays in error and allows EOS alone from then on.
    if state.matcher is not None and not state.matcher.consume_token(token):
        logger.warning("sampled token %d breaks its grammar: %s", token,
                       state.matcher.get_error())


def _rows_of(offsets: np.ndarray) -> torch.Tensor:
    """The row of each element of a CSR array."""
    return torch.repeat_interleave(torch.arange(len(offsets) - 1),
                                   torch.from_numpy(np.diff(offsets)))


def _penalize(y: torch.Tensor, batch: _Batch) -> torch.Tensor:
    """The logits y [N, V] with the penalties and bans applied (a copy when any applies)."""
    (seen_off, seen), (pen_off, pen_ids, deltas), (ban_off, bans) = (
        batch.seen, batch.penalties, batch.bans)
    if not (len(seen) or len(pen_ids) or len(bans)):
        return y
    y, device = y.clone(), y.device
    if len(seen):  # v * (1 / penalty) as the kernel: exactly the same floats
        rows, cols = _rows_of(seen_off).to(device), torch.from_numpy(seen).long().to(device)
        v = y[rows, cols]
        rep, inv_rep = batch.fparams[:, 3].to(device), batch.fparams[:, 4].to(device)
        y[rows, cols] = torch.where(v > 0, v * inv_rep[rows], v * rep[rows])
    if len(pen_ids):
        rows, cols = _rows_of(pen_off).to(device), torch.from_numpy(pen_ids).long().to(device)
        y[rows, cols] -= torch.from_numpy(deltas).to(device)
    if len(bans):
        rows, cols = _rows_of(ban_off).to(device), torch.from_numpy(bans).long().to(device)
        y[rows, cols] = float("-inf")
    return y


def _sample_torch(logits: torch.Tensor, states: list[_RequestState],
                  batch: _Batch) -> torch.Tensor:
    """The batched reference path: the same thresholds and draw as sampler.c."""
    device = logits.device
    y = _penalize(logits.float(), batch)
    tokens = torch.empty(len(states), dtype=torch.long, device=device)
    greedy = [i for i, s in enumerate(states) if s.greedy]
    if greedy:
        index = torch.tensor(greedy, device=device)
        tokens[index] = y[index].argmax(dim=-1)
    rows = [i for i, s in enumerate(states) if not s.greedy]
    if not rows:
        return tokens
    index = torch.tensor(rows, device=device)
    rel = _kept_mass(y[index], [states[i] for i in rows], batch.fparams[rows].to(device),
                     batch.iparams[rows].to(device))
    # Inverse CDF in token order: the first token whose cumulative mass exceeds u * total.
    u = torch.tensor([uniform(states[i].key & _MASK, states[i].position) for i in rows],
                     dtype=torch.float64, device=device)
    tokens[index] = inverse_cdf(rel, u)
    return tokens


def inverse_cdf(mass: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of mass [N, V] (>= 0, unnormalized): the first token in token order whose
    cumulative mass exceeds u * total (u [N] in [0, 1))."""
    cumulative = mass.cumsum(dim=1, dtype=torch.float64)
    total = cumulative[:, -1:].contiguous()
    chosen = torch.searchsorted(cumulative, u.unsqueeze(1) * total, right=True)
    # If u * total rounds up to total: the last token with mass (where the sum reaches it).
    last_with_mass = torch.searchsorted(cumulative, total)
    return torch.minimum(chosen, last_with_mass).squeeze(1)


def _kept_mass(y: torch.Tensor, states: list[_RequestState], fparams: torch.Tensor,
               iparams: torch.Tensor) -> torch.Tensor:
    """Rows of penalized logits y of sampled (not greedy) requests: each token's probability
    relative to the top token's, 0 where temperature's filters drop it (unnormalized)."""
    rows = range(len(states))
    inv_temp, top_p, log_min_p, top_k = (fparams[:, 0:1], fparams[:, 1:2], fparams[:, 2:3],
                                         iparams[:, 0:1])
    m = y.max(dim=1, keepdim=True).values
    d = (y - m) * inv_temp  # log of the probability relative to the top token's
    rel = torch.exp(d)
    t_k = t_p = torch.full_like(m, _NO_LIMIT)
    uses_k = [states[i].top_k > 0 for i in rows]
    uses_p = [states[i].params.top_p < 1.0 for i in rows]
    if any(uses_k) or any(uses_p):
        # Only the top-k values are needed unless a top-p row has no top-k.
        if any(p and not k for p, k in zip(uses_p, uses_k)):
            sorted_y, order = y.sort(dim=1, descending=True)
        else:
            sorted_y, order = y.topk(max(states[i].top_k for i in rows), dim=1)
        if any(uses_k):  # ties with the k-th largest are kept too
            kth = sorted_y.gather(1, (top_k - 1).clamp(min=0))
            t_k = torch.where(top_k > 0, kth, t_k)
        if any(uses_p):  # kept: mass of strictly larger y (within top-k) < top_p * total
            mass = torch.where(y >= t_k, rel, 0).double()
            sorted_mass = mass.gather(1, order)
            # The mass before each position (shifted, rather than minus itself: exact).
            above = torch.nn.functional.pad(sorted_mass.cumsum(dim=1)[:, :-1], (1, 0))
            limit = top_p.double() * mass.sum(dim=1, keepdim=True)
            # The first tie holds the mass strictly above the tied value, so the last kept
            # position's value keeps all its ties: the threshold is that value.
            last = (above < limit).sum(dim=1, keepdim=True) - 1
            t_p = torch.where(top_p < 1, sorted_y.gather(1, last), t_p)
    if any(uses_k) or any(uses_p) or any(states[i].params.min_p > 0 for i in rows):
        rel.masked_fill_((y < t_k) | (y < t_p) | (d < log_min_p), 0)  # else every token
    return rel
