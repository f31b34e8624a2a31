r"""From StructuredOutputsParams to an llguidance grammar, and the checks that make a bad one a
400 before it reaches the engine.

JSON is generated compact (no free whitespace, ", " and ": " separators as json.dumps writes
them): a model may otherwise spend its tokens on whitespace that the grammar allows forever,
which random weights do. Unknown JSON Schema keywords are errors, not ignored: an output that
silently ignores a constraint the client asked for is worse than a 400.

A `regex` constraint has ECMA-262's classes, as a JSON Schema `pattern` has (llguidance's JSON
compiler reads patterns so): `\d` is [0-9] and `\w` is [0-9A-Za-z_], ASCII only, where
llguidance's own regexes are Rust's and `\d` is any Unicode digit ("٢" would pass for one).
`\s` is Unicode whitespace in both.
"""

from __future__ import annotations

import json

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from minivllm.structured_output.params import StructuredOutputsParams

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ECMA_ASCII_CLASSES = "dw"  # llguidance.regex_to_lark: \d and \w as ECMA-262 (and JSON Schema)


class GrammarError(ValueError):
    """A constraint that cannot be built; `field` names the part of the request at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _json_schema_grammar(schema, field: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(field, f"not valid JSON: {e}") from e
    if not isinstance(schema, dict):
        raise GrammarError(field, "a JSON schema must be an object")
    return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)


def _structural_tag_grammar(text: str, field: str) -> str:
    """vLLM's {"type": "structural_tag", "structures": [{"begin", "schema", "end"}],
    "triggers": [...]}: free text in which each structure, once its trigger appears, is
    completed as begin + JSON for the schema + end."""
    try:
        spec = json.loads(text)
        triggers = spec["triggers"]
        tags = []
        for s in spec["structures"]:
            trigger = next((t for t in triggers if s["begin"].startswith(t)), None)
            if trigger is None:
                raise GrammarError(field, f"no trigger starts {s['begin']!r}")
            tags.append(llguidance.StructTag(trigger=trigger, begin=s["begin"],
                                             grammar=s["schema"], end=s["end"]))
    except (json.JSONDecodeError, KeyError, TypeError, AssertionError) as e:
        raise GrammarError(field, f"expected {{\"structures\": [{{\"begin\", \"schema\", "
                                  f"\"end\"}}], \"triggers\": [...]}} ({e!r})") from e
    return llguidance.StructTag.to_grammar(tags)


def build_grammar(params: StructuredOutputsParams, field: str | None = None) -> str:
    """The llguidance grammar of a constraint; GrammarError naming `field` (the request's
    field that carried it; by default structured_outputs.<kind>)."""
    kind = params.kind
    where = field or f"structured_outputs.{kind}"
    if kind == "json":
        return _json_schema_grammar(params.json, where)
    if kind == "json_object":
        return _json_schema_grammar({"type": "object"}, where)
    if kind == "regex":  # ECMA-262's \d and \w (see above); "/" escaped for Lark's /.../
        regex = llguidance.regex_to_lark(params.regex, ECMA_ASCII_CLASSES)
        return llguidance.LLMatcher.grammar_from_lark(f"start: /{regex}/")
    if kind == "choice":
        lark = "start: " + " | ".join(json.dumps(c) for c in params.choice)
        return llguidance.LLMatcher.grammar_from_lark(lark)
    if kind == "grammar":
        try:
            return llguidance.LLMatcher.grammar_from_lark(any_to_lark(params.grammar))
        except Exception as e:  # the GBNF converter's own errors
            raise GrammarError(where, f"not a valid EBNF/Lark grammar: {e}") from e
    return _structural_tag_grammar(params.structural_tag, where)


def check_grammar(params: StructuredOutputsParams, field: str | None = None) -> str:
    """build_grammar, then llguidance's own check (syntax, unsupported schema keywords), with
    no tokenizer: cheap enough for the API server to run on every request."""
    try:
        grammar = build_grammar(params, field)
    except GrammarError:
        raise
    except Exception as e:  # whatever else odd input makes the converters raise
        raise GrammarError(field or f"structured_outputs.{params.kind}",
                           f"cannot be built: {e!r}") from e
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise GrammarError(field or f"structured_outputs.{params.kind}", error)
    return grammar
