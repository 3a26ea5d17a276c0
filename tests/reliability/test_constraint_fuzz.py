"""Generated JSON schemas, regexes and grammars, through the server's request path (body -> protocol
request -> SamplingParams -> grammar compile): each is accepted or refused with a ValueError (the server's
400), never another exception (a 500) and never a hang (each within the compile budget)."""

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.models.build import load_model_spec
from testbed.server import protocol as P
from testbed.structured.grammar import GrammarBackend

TIMEOUT_S = 2.0
KEYWORDS = ["type", "properties", "required", "items", "minItems", "maxItems", "minLength", "maxLength", "enum"]
KEYWORDS += ["const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "pattern", "minimum", "maximum", "format"]
KEYWORDS += ["additionalProperties", "prefixItems", "not", "multipleOf", "minProperties", "uniqueItems"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**7), 10**7),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["string", "integer", "number", "object", "array", "boolean", "null", "#", "#/$defs/a"]),
    st.sampled_from(["http://127.0.0.1:9/x", "file:///etc/passwd", "#/properties/a", "email", "date", "[a-z]+"]),
    st.text(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYWORDS), st.text(max_size=4)), inner, max_size=5),
    ),
    max_leaves=25,
)
schemas = st.dictionaries(st.sampled_from(KEYWORDS + ["a"]), values, max_size=6)
regex_atoms = st.sampled_from(["a", "b", ".", "\\d", "[a-z]", "[^x]", "(", ")", "|", "*", "+", "?", "{2}", "{1,3}"])
regex_atoms |= st.sampled_from(["^", "$", "\\", "[", "]", "{", "}", "(?:", "(?=", "\\1", "é", "\n", " "])
regexes = st.lists(regex_atoms, max_size=12).map("".join)
grammars = st.lists(
    st.sampled_from(['root ::= "a"', "root ::= b", 'b ::= "x" b', 'b ::= "y"', "root ::= [a-z]*", "::=", "|", "("]),
    max_size=4,
).map("\n".join)
fields = st.one_of(
    st.fixed_dictionaries({"guided_json": st.one_of(schemas, values)}),
    st.fixed_dictionaries({"guided_regex": regexes}),
    st.fixed_dictionaries({"guided_grammar": grammars}),
    st.fixed_dictionaries({"guided_choice": st.lists(st.text(max_size=5), max_size=4)}),
    st.fixed_dictionaries({"structured_outputs": st.dictionaries(st.sampled_from(["json", "regex", "x"]), values)}),
    st.fixed_dictionaries({"response_format": st.dictionaries(st.sampled_from(["type", "json_schema"]), values)}),
)


@pytest.fixture(scope="module")
def backend():
    tok = load_model_spec("smollm2-135m").tokenizer
    grammars = GrammarBackend(tok, len(tok), [tok.eos_token_id], {"compile_timeout_s": TIMEOUT_S}, 2048)
    grammars.ready().result()
    return grammars


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(extra=fields)
def test_generated_constraints_are_accepted_or_refused_never_crash(backend, extra):
    body = {"model": "m", "prompt": "hi", "max_tokens": 4} | extra
    start = time.monotonic()
    try:
        req = P.CompletionRequest.model_validate(body)
        params = req.to_sampling_params()  # the server answers ValueError / TypeError with a 400
        if params.structured_outputs is not None:
            backend.compile(params.structured_outputs)
    except (ValueError, TypeError):  # pydantic's ValidationError is a ValueError
        pass
    assert time.monotonic() - start < TIMEOUT_S + 2.0
