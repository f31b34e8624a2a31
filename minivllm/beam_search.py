"""Beam search, spelled like vLLM's (vllm/beam_search.py: BeamSearchSequence,
BeamSearchOutput) and searching as transformers' `generate(num_beams=k, do_sample=False)`
does, so that the two return the same sequences.

The search of one prompt is a BeamSearch. It never runs the model: a driver (LLM.beam_search,
or the server's completions with use_beam_search) asks it for its live beams' token ids
(`beam_token_ids`), runs one step of each as a request of max_tokens=1 with
`2 * beam_width` logprobs (`step_params`), and hands back each beam's top tokens
(`advance`). Those requests share KV blocks through the prefix cache: see
docs/beam-search.md.

transformers' rules, replicated (generation/utils.py, `_beam_search`):
- each step takes the 2k (with several EOS ids, (EOS ids + 1) * k) best (beam, token) continuations by cumulative logprob;
- the live beams of the next step are the best k of them that do not end (EOS, or the
  max_tokens-th token);
- of those 2k, the ones among the first k that end are finished hypotheses, scored
  cum_logprob / generated_len ** length_penalty (generated tokens only, EOS included, the
  prompt not); the best k hypotheses are kept;
- the search ends when every continuation ends (max_tokens), or, early_stopping True, when
  k hypotheses are kept, or else when no live beam can beat the worst kept hypothesis: its
  score over the current generated length (early_stopping False), or over max_tokens
  ("never" with a positive length_penalty).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field

from minivllm.outputs import Logprob, RequestOutput
from minivllm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams


@dataclass
class BeamSearchSequence:
    """One beam: `tokens` include the prompt's (as vLLM's); `logprobs` has one dict per
    generated token, that step's top 2 * beam_width tokens and the chosen one."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None  # "stop" (EOS) or "length"


@dataclass
class BeamSearchOutput:
    """A prompt's beam_width best hypotheses, best first."""

    sequences: list[BeamSearchSequence]


def num_candidates(params: BeamSearchParams, eos_token_ids: Collection[int]) -> int:
    """Continuations kept per step, transformers' (number of EOS ids + 1) * k, at least 2k:
    even if every EOS is among them, k beams go on. Each beam's top this-many tokens hold
    the step's best this-many over all beams."""
    num_eos = 0 if params.ignore_eos else len(eos_token_ids)
    return max(2, 1 + num_eos) * params.beam_width


def step_params(num_logprobs: int) -> SamplingParams:
    """One step of a beam: its next token's top logprobs (the token drawn greedily is not
    used; EOS is ignored so that every beam's request returns its logprobs)."""
    return SamplingParams(temperature=0.0, max_tokens=1, logprobs=num_logprobs,
                          ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)


def check_beam_search(params: BeamSearchParams, eos_token_ids: Collection[int], max_logprobs: int,
          prompt_len: int, max_model_len: int) -> None:
    """What the engine would reject for a step's request, named by the caller's field."""
    if num_candidates(params, eos_token_ids) > max_logprobs:
        raise ValueError(f"beam_width must be <= {max_logprobs // 2} here: each step asks "
                         f"{num_candidates(params, eos_token_ids)} logprobs of every beam, "
                         f"max_logprobs is {max_logprobs}; got {params.beam_width}")
    if prompt_len + params.max_tokens > max_model_len:
        raise ValueError(f"max_tokens: the prompt ({prompt_len} tokens) and max_tokens "
                         f"({params.max_tokens}) exceed the context ({max_model_len})")


def advance_all(searches: list[BeamSearch], outputs: list[RequestOutput]) -> None:
    """Hand each search its live beams' step outputs, `outputs` in the order of the searches'
    beam_token_ids()."""
    tops = iter(output.outputs[0].logprobs[0] for output in outputs)
    for search in searches:
        search.advance([next(tops) for _ in search.running])


class BeamSearch:
    def __init__(self, prompt_token_ids: list[int], params: BeamSearchParams,
                 eos_token_ids: Collection[int]) -> None:
        self.prompt = list(prompt_token_ids)
        self.params = params
        self.eos = frozenset() if params.ignore_eos else frozenset(eos_token_ids)
        self.num_candidates = num_candidates(params, self.eos)
        self.running = [BeamSearchSequence(tokens=list(self.prompt))]
        self.finished: list[tuple[float, BeamSearchSequence]] = []  # best first
        self.generated = 0  # tokens each live beam has generated
        self._improvable = True
        self.done = False

    def beam_token_ids(self) -> list[list[int]]:
        """The live beams' token ids (prompt included): the next step's requests."""
        return [beam.tokens for beam in self.running]

    def advance(self, top: list[dict[int, Logprob]]) -> None:
        """One step: `top[i]` is live beam i's top 2k next tokens."""
        k, p = self.params.beam_width, self.params
        candidates = sorted(
            ((beam.cum_logprob + lp.logprob, i, token)
             for i, beam in enumerate(self.running) for token, lp in top[i].items()),
            key=lambda c: -c[0])[:self.num_candidates]
        last = self.generated + 1 >= p.max_tokens
        running, new_finished = [], []
        for rank, (score, i, token) in enumerate(candidates):
            parent = self.running[i]
            ends = last or token in self.eos
            if ends and rank >= k or not ends and len(running) == k:
                continue  # only the first k may finish; k beams go on
            beam = BeamSearchSequence(
                tokens=parent.tokens + [token], logprobs=parent.logprobs + [top[i]],
                cum_logprob=score, finish_reason=None if not ends else
                "stop" if token in self.eos else "length")
            (new_finished if ends else running).append(beam)
        full = len(self.finished) == k
        if self._improvable and not (full and p.early_stopping is True):
            length = (self.generated + 1) ** p.length_penalty
            merged = self.finished + [(b.cum_logprob / length, b) for b in new_finished]
            self.finished = sorted(merged, key=lambda f: -f[0])[:k]
        self.running = running
        self.generated += 1
        self._improvable = self._improvable and self._can_improve()
        full = len(self.finished) == k
        self.done = (not running or not self._improvable
                     or (full and p.early_stopping is True))
        if self.done:
            self.running = []

    def _can_improve(self) -> bool:
        """transformers' heuristic: can the best live beam beat the worst kept hypothesis?"""
        if not self.running or len(self.finished) < self.params.beam_width:
            return True
        p = self.params
        length = (p.max_tokens if p.early_stopping == "never" and p.length_penalty > 0
                  else self.generated)
        return self.running[0].cum_logprob / length ** p.length_penalty > self.finished[-1][0]

    def best(self) -> list[BeamSearchSequence]:
        """The kept hypotheses, best first."""
        return [beam for _, beam in self.finished]

    def output(self, decode) -> BeamSearchOutput:
        """The best hypotheses, best first; `decode(token_ids)` gives each one's text (of
        all its tokens, the prompt's too, as vLLM's LLM.beam_search)."""
        sequences = [dataclasses.replace(beam, text=decode(beam.tokens)) for beam in self.best()]
        return BeamSearchOutput(sequences=sequences)
