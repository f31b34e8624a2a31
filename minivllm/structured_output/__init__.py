"""Constrained decoding (JSON schema, regex, choice, grammar, structural tags) with
llguidance: params.py (what a request asks), grammar.py (its grammar, checked), manager.py
(compiled off the engine's critical path, matchers, the logits bitmask)."""
