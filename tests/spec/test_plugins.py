"""A researcher's own speculative method by import path (`spec.method=mydrafts:RepeatLast`): the engine
drafts with it and verification keeps greedy output exact; its options are checked as a built-in's."""

import textwrap

import pytest
from hydra import compose, initialize_config_module

from experiments.run.settings import run_settings
from testbed import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODULE = """
from testbed.spec.base import Proposer


class RepeatLast(Proposer):
    \"\"\"Drafts the last token again, up to max_drafts times (right on runs of a repeated token).\"\"\"

    name = "repeat_last"
    calls = 0

    def __init__(self, max_drafts: int):
        self.max_drafts = max_drafts

    def propose(self, requests, num_tokens):
        RepeatLast.calls += 1
        return [([r.all_token_ids[-1]] * min(k, self.max_drafts), None) for r, k in zip(requests, num_tokens)]
"""
PROMPTS = [[5, 6, 7, 7, 7, 7], [9, 10, 11, 12, 13], [3] * 12]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture
def mydrafts(researcher_folder):
    (researcher_folder / "mydrafts.py").write_text(textwrap.dedent(MODULE))
    import mydrafts

    return mydrafts


def generate(spec):
    llm = LLM(model="tiny", num_blocks=64, block_size=4, speculative_config=spec)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)], llm.engine.spec_stats


def test_a_users_proposer_drafts_and_greedy_output_stays_exact(mydrafts):
    reference, _ = generate(None)
    spec = {"method": "mydrafts:RepeatLast", "num_speculative_tokens": 3, "options": {"max_drafts": 2}}
    out, stats = generate(spec)
    assert out == reference
    assert mydrafts.RepeatLast.calls > 0
    assert stats["drafted"] > 0 and stats["drafted"] <= 2 * stats["verifications"]


def cfg(*overrides):
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        return compose("config", overrides=["model=tiny", "progress=false", *overrides])


def test_the_method_by_path_through_the_composed_config(mydrafts):
    settings = run_settings(cfg("spec.method=mydrafts:RepeatLast", "+spec.options={max_drafts:2}"))
    spec = settings.engine.speculative
    assert (spec.method, spec.options) == ("mydrafts:RepeatLast", {"max_drafts": 2})
    with pytest.raises(ValueError, match=r"takes no options \['max_draft'\]; its options: \['max_drafts'\]"):
        run_settings(cfg("spec.method=mydrafts:RepeatLast", "+spec.options={max_draft:2}"))
    with pytest.raises(ValueError, match="missing a required argument: 'max_drafts'"):
        run_settings(cfg("spec.method=mydrafts:RepeatLast"))
    with pytest.raises(ValueError, match=r"unknown speculative method 'ngarm'; choose one of \['none', 'ngram'"):
        run_settings(cfg("spec.method=ngarm"))
    with pytest.raises(ValueError, match="is not a subclass of testbed.spec.base.Proposer"):
        run_settings(cfg("spec.method=textwrap:TextWrapper"))
    with pytest.raises(ValueError, match=r"'ngram' takes no options \['max_drafts'\]"):
        run_settings(cfg("spec=ngram", "+spec.options={max_drafts:2}"))
