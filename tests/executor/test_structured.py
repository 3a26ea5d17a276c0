"""Structured output through xgrammar masks: every sample parses against its constraint."""

import json
import re

import jsonschema
import pytest

from testbed import LLM, SamplingParams
from testbed.structured import StructuredOutputsParams
from testbed.structured.grammar import choice_grammar

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
PROMPT = "Describe a person as JSON with a name, an age and a city:"


@pytest.fixture(scope="module")
def llm():
    return LLM(model="smollm2-135m", num_blocks=256, max_model_len=512, max_num_seqs=16)


def generate(llm, constraint: StructuredOutputsParams, seeds, max_tokens=48, **kwargs):
    ids = llm.get_tokenizer().encode(PROMPT)
    params = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=max_tokens, structured_outputs=constraint, **kwargs)
        for s in seeds
    ]
    return [o.outputs[0] for o in llm.generate([ids] * len(seeds), params)]


def test_json_schema_holds_for_many_seeds(llm):
    steps = []
    llm.engine.step_callbacks.append(steps.append)
    try:
        outs = generate(llm, StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True), range(16))
    finally:
        llm.engine.step_callbacks.remove(steps.append)
    for out in outs:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)
    assert len({out.text for out in outs}) > 4  # sampled, not one forced string
    assert all(s.grammar_time_s > 0 for s in steps if s.num_decode_tokens)  # its cost is in the step timings


def test_regex_choice_grammar_and_json_object(llm):
    for out in generate(llm, StructuredOutputsParams(regex=r"[A-Z][a-z]{2,8} \d{2}"), range(4)):
        assert re.fullmatch(r"[A-Z][a-z]{2,8} \d{2}", out.text), out.text
    choices = ["yes", "no", 'a "quoted"\nanswer']
    for out in generate(llm, StructuredOutputsParams(choice=choices), range(4)):
        assert out.text in choices
    grammar = 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?'
    for out in generate(llm, StructuredOutputsParams(grammar=grammar), range(4), max_tokens=32):
        assert re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?)*\)", out.text) or out.finish_reason == "length"
    for out in generate(llm, StructuredOutputsParams(json_object=True, disable_any_whitespace=True), range(2), 64):
        assert out.finish_reason == "length" or isinstance(json.loads(out.text), dict)


def test_mixed_batch_leaves_other_requests_alone(llm):
    ids = llm.get_tokenizer().encode(PROMPT)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    alone = llm.generate([ids], greedy)[0].outputs[0].token_ids
    constrained = SamplingParams(temperature=0, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=["A"]))
    outs = llm.generate([ids, ids], [greedy, constrained])
    assert outs[0].outputs[0].token_ids == alone and outs[1].outputs[0].text == "A"
    assert not llm.engine.sampler.matchers  # dropped when the request finished


@pytest.mark.parametrize(
    "constraint, match",
    [
        (dict(json={"type": "integer", "minimum": 5, "maximum": 1}), "minimum greater than maximum"),
        (dict(json={"type": "no-such-type"}), "Unsupported type"),
        (dict(json="{not json"), "not valid JSON"),
        (dict(json={"enum": []}), "enum"),
        (dict(json=False), "cannot accept any value"),
        (dict(regex="(unclosed"), "invalid regex"),
        (dict(grammar="root ::= "), "invalid grammar"),
    ],
)
def test_invalid_or_unsatisfiable_constraints_are_refused(llm, constraint, match):
    with pytest.raises(ValueError, match=match):
        llm.generate([[1, 2, 3]], SamplingParams(structured_outputs=StructuredOutputsParams(**constraint)))
    assert not llm.engine.has_unfinished()


def test_constraint_shape_is_checked():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(json={}, regex="a")
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="non-empty"):
        StructuredOutputsParams(choice=[])
    assert choice_grammar(['say "hi"']) == 'root ::= "say \\"hi\\""'


def test_needs_a_tokenizer():
    tiny = LLM(model="tiny", block_size=8, num_blocks=32)
    with pytest.raises(ValueError, match="tokenizer"):
        tiny.generate([[1, 2, 3]], SamplingParams(structured_outputs=StructuredOutputsParams(regex="a+")))
