"""The offline API refuses what the server refuses, with the same typed errors (ValueError subclasses naming
the parameter, or TypeError for a wrong type), never AttributeError, RecursionError or jinja2 errors."""

import pytest

from testbed import LLM, SamplingParams
from testbed.sampling_params import SamplingParamError
from testbed.structured import StructuredOutputsParams
from testbed.structured.params import StructuredOutputError


@pytest.fixture(scope="module")
def llm(one_torch_thread):
    return LLM(model="tiny", tokenizer="smollm2-135m", kernel="torch", num_blocks=128)


def deep_schema(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize(
    "make,error,match",
    [
        (lambda: SamplingParams(bad_words=[5]), TypeError, "bad_words"),
        (lambda: SamplingParams(repetition_penalty=float("inf")), SamplingParamError, "repetition_penalty"),
        (lambda: StructuredOutputsParams(choice="abc"), StructuredOutputError, "choice must be a list"),
        (lambda: StructuredOutputsParams(regex=5), StructuredOutputError, "regex must be a string"),
        (lambda: StructuredOutputsParams(json="[" * 100_000), StructuredOutputError, "nested too deeply"),
        (lambda: SamplingParams(structured_outputs={"bogus": 1}), SamplingParamError, "bogus"),
        (lambda: SamplingParams(structured_outputs={}), StructuredOutputError, "exactly one"),
        (lambda: SamplingParams(structured_outputs="[a-z]"), TypeError, "structured_outputs"),
    ],
)
def test_bad_params_are_typed_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_structured_outputs_as_a_dict_works(llm):
    params = SamplingParams(temperature=0, max_tokens=4, structured_outputs={"choice": ["yes", "no"]})
    assert isinstance(params.structured_outputs, StructuredOutputsParams)
    assert llm.generate([[5, 6, 7]], params)[0].outputs[0].text in ("yes", "no")


@pytest.mark.parametrize(
    "constraint,match",
    [
        ({"json": deep_schema(100_000)}, "max_schema_depth"),
        ({"regex": "a^b"}, "anchor"),
        ({"json": {"$ref": "file:///etc/passwd"}}, "never fetched"),
        ({"choice": [f"c{i}" for i in range(30_000)]}, "max_grammar_bytes"),
        ({"grammar": 'root ::= "x" a\na ::= "y" a'}, "any finite output"),
    ],
)
def test_bad_constraints_raise_before_anything_runs(llm, constraint, match):
    params = SamplingParams(max_tokens=4, structured_outputs=constraint)
    with pytest.raises(StructuredOutputError, match=match):
        llm.generate([[5, 6, 7]], params)
    assert not llm.engine.has_unfinished()


@pytest.mark.parametrize(
    "messages,match",
    [
        ([{"content": "hi"}], "role must be a string"),
        ([{"role": "user"}], "content must be"),
        (["hi"], "a dict with role and content"),
        ([], "non-empty"),
    ],
)
def test_chat_messages_are_checked(llm, messages, match):
    with pytest.raises(ValueError, match=match):
        llm.chat([messages] if messages else [[]])


def test_trace_rate_zero_is_refused_naming_it():
    from experiments.traces import TraceError, synthetic

    with pytest.raises(TraceError, match="rate"):
        synthetic.load({"name": "synthetic", "rate": 0, "num_requests": 3}, 1000, 512)
