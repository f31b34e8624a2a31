"""Grammars compiled off the engine's critical path, cached per constraint; matchers made from
them; the token bitmask of a batch's constrained rows applied to their logits.

Compiling (llguidance's LLMatcher for the engine's tokenizer: the grammar parsed, its lexer
set up) runs on one worker thread, which llguidance lets run without the GIL. The engine core
submits a request's constraint when the request arrives and keeps the request out of the
scheduler until the grammar is ready (engine/core.py), so that other requests' steps never
wait on a compile. Each request then gets a deep copy of the compiled matcher, advanced by
the sampler with every token it samples (model/sampler.py).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import llguidance.hf
import numpy as np
import torch

from minivllm.structured_output.grammar import GrammarError, build_grammar
from minivllm.structured_output.number_guard import JSON_KINDS, NumberGuardTables
from minivllm.structured_output.params import StructuredOutputsParams

logger = logging.getLogger(__name__)

CACHE_SIZE = 256  # compiled grammars kept (least recently used dropped first)


class StructuredOutputManager:
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: set[int]) -> None:
        self.vocab_size = vocab_size
        self._hf_tokenizer, self._eos = tokenizer, sorted(eos_token_ids)
        self._lltokenizer: llguidance.LLTokenizer | None = None  # built on first use (~1 s)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        self._compiled: OrderedDict[str, Future] = OrderedDict()
        self._lock = threading.Lock()
        self._guard_tables: Future | None = None  # JSON number guard's, built on first use

    def _tokenizer(self) -> llguidance.LLTokenizer:
        if self._lltokenizer is None:  # only ever on the worker thread
            self._lltokenizer = llguidance.hf.from_tokenizer(
                self._hf_tokenizer, n_vocab=self.vocab_size, eos_token=self._eos)
        return self._lltokenizer

    def _compile(self, params: StructuredOutputsParams) -> llguidance.LLMatcher:
        matcher = llguidance.LLMatcher(self._tokenizer(), build_grammar(params), log_level=0)
        if matcher.is_error():
            raise GrammarError(f"structured_outputs.{params.kind}", matcher.get_error())
        return matcher

    def _build_guard_tables(self) -> NumberGuardTables:
        tokenizer = self._tokenizer()
        return NumberGuardTables([tokenizer.decode_bytes([t]) if t < tokenizer.vocab_size
                                  else b"" for t in range(self.vocab_size)])

    def number_guard_tables(self) -> NumberGuardTables:
        """The tables of the JSON number guard (number_guard.py). Built on the compile thread
        (where the tokenizer lives), queued ahead of the first JSON grammar (submit), so a
        request whose grammar is ready never waits for them."""
        with self._lock:
            if self._guard_tables is None:
                self._guard_tables = self._executor.submit(self._build_guard_tables)
        return self._guard_tables.result()

    def submit(self, params: StructuredOutputsParams) -> Future:
        """The future of the constraint's compiled matcher: cached, or compiling now."""
        key = params.key()
        with self._lock:
            if params.kind in JSON_KINDS and self._guard_tables is None:
                self._guard_tables = self._executor.submit(self._build_guard_tables)
            future = self._compiled.get(key)
            if future is None or (future.done() and future.exception() is not None):
                future = self._compiled[key] = self._executor.submit(self._compile, params)
                while len(self._compiled) > CACHE_SIZE:
                    self._compiled.popitem(last=False)
            self._compiled.move_to_end(key)
            return future

    def new_matcher(self, params: StructuredOutputsParams) -> llguidance.LLMatcher:
        """A fresh matcher for one request (blocks if the grammar is still compiling, which
        the engine core avoids by waiting for submit()'s future first)."""
        return self.submit(params).result().deep_copy()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def fill_bitmask(matchers: list[llguidance.LLMatcher], vocab_size: int) -> np.ndarray:
    """The allowed next tokens of each matcher: [len(matchers), vocab_size] bool."""
    words = np.empty((len(matchers), (vocab_size + 31) // 32), dtype=np.int32)
    for row, matcher in enumerate(matchers):
        matcher.unsafe_compute_mask_ptr(words[row].ctypes.data, words.shape[1] * 4)
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")
    return bits[:, :vocab_size].astype(bool)


def apply_bitmask(logits: torch.Tensor, rows: list[int], allowed: np.ndarray) -> torch.Tensor:
    """The logits with the disallowed tokens of `rows` at -inf (as min_tokens bans: the
    sampler and its kernel never draw a -inf token, greedy or not). A copy: the model's
    logits are inference tensors. On the CPU through numpy: torch's indexed assignment
    costs ~100x more for these small batches (its parallel regions wait for busy cores)."""
    masked = logits.clone()
    if masked.device.type == "cpu":
        values = masked.numpy()
        values[rows] = np.where(allowed, values[rows], -np.inf)
        return masked
    index = torch.tensor(rows, device=logits.device)
    mask = torch.from_numpy(~allowed).to(logits.device)
    masked[index] = masked[index].masked_fill(mask, float("-inf"))
    return masked
