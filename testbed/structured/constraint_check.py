"""Checks on a constraint before it is compiled (cheap, no tokenizer): its size against
`structured_outputs.max_grammar_bytes`, a regex's empty or anchor-broken language, a JSON schema's
unsupported or unsatisfiable parts (schema_check.py). A grammar whose language is empty or holds no
finite output is found after compiling (GrammarBackend, productive.py)."""

from __future__ import annotations

import json

from testbed.structured.limits import StructuredOutputsConfig
from testbed.structured.params import StructuredOutputError, StructuredOutputsParams
from testbed.structured.schema_check import check_depth, check_json_schema


def constraint_bytes(params: StructuredOutputsParams) -> int:
    """UTF-8 size of the constraint's text as the compiler sees it."""
    if params.json is not None:
        return len(json.dumps(params.json, ensure_ascii=False).encode())
    if params.regex is not None:
        return len(params.regex.encode())
    if params.grammar is not None:
        return len(params.grammar.encode())
    if params.choice is not None:
        return sum(len(json.dumps(c, ensure_ascii=False).encode()) + 3 for c in params.choice)
    return 0


def check_regex(regex: str) -> None:
    """An empty regex, and anchors inside one: xgrammar drops `^` and `$` wherever they are, so `a^b`
    (which matches nothing) would generate "ab"; only a leading `^` and a trailing `$` keep their meaning."""
    if regex == "":
        raise StructuredOutputError("the regex is empty: it allows only empty output")
    in_class = escaped = False
    for i, ch in enumerate(regex):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
            if regex[i + 1 : i + 2] == "^":  # a negated class, not an anchor
                continue
        elif ch == "^" and i != 0:
            raise StructuredOutputError(
                f"the regex has an anchor ^ at position {i}: anchors are supported only at its start and end"
            )
        elif ch == "$" and i != len(regex) - 1:
            raise StructuredOutputError(
                f"the regex has an anchor $ at position {i}: anchors are supported only at its start and end"
            )
    if regex in ("^", "$", "^$"):
        raise StructuredOutputError("the regex is empty: it allows only empty output")


def check_constraint(
    params: StructuredOutputsParams, config: StructuredOutputsConfig, max_output_chars: int | None = None
) -> None:
    if params.json is not None:  # before measuring: json.dumps recurses
        check_depth(params.json, config.max_schema_depth)
    size = constraint_bytes(params)
    if size > config.max_grammar_bytes:
        raise StructuredOutputError(
            f"the {params.kind} constraint is {size} bytes, more than the limit of {config.max_grammar_bytes} "
            "(structured_outputs.max_grammar_bytes)"
        )
    if params.regex is not None:
        check_regex(params.regex)
    if params.json is not None:
        check_json_schema(params.json, config.max_schema_depth, max_output_chars)
