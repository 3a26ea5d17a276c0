"""The parts after the executor return what they decide and the engine core applies it (docs/ARCHITECTURE.md,
"Data flow of one step"): the output processor and the speculator change no request's scheduling state."""

import pytest

from testbed import LLM, SamplingParams
from testbed.core.step_updates import StepUpdates
from testbed.models.build import load_model_spec
from testbed.output_processor import OutputProcessor
from testbed.request import Request, RequestStatus

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NGRAM = {"method": "ngram", "num_speculative_tokens": 3}


def test_find_stops_returns_the_finish_and_changes_no_state():
    tokenizer = load_model_spec("smollm2-135m").tokenizer
    processor = OutputProcessor(tokenizer)
    request = Request("r", [1, 2, 3], SamplingParams(stop=["the end"], max_tokens=50))
    other = Request("o", [1, 2, 3], SamplingParams(max_tokens=50))
    for r in (request, other):
        processor.add_request(r)
        r.status = RequestStatus.RUNNING
    first = tokenizer.encode("hello world,", add_special_tokens=False)
    rest = tokenizer.encode(" and that is the end of it", add_special_tokens=False)
    for token in first:
        request.append_output_token(token, None, 0.0)
    assert processor.find_stops(StepUpdates([request, other], [first, [5]])) == []
    for token in rest:
        request.append_output_token(token, None, 1.0)
    finishes = processor.find_stops(StepUpdates([other, request], [[5], rest]))
    assert finishes == [(request, RequestStatus.FINISHED_STOPPED, None)]
    # decided, not applied: the engine ends it in the scheduler
    assert request.status is RequestStatus.RUNNING and request.finish_time is None
    assert request.stop_reason == "the end"


def test_proposal_returns_drafts_and_the_scheduler_takes_them():
    llm = LLM(model="tiny", num_blocks=64, block_size=4, speculative_config=NGRAM)
    engine = llm.engine
    engine.add_request("a", [7, 8, 9, 10] * 5, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    propose, proposals = engine.speculator.propose, []

    def recording_propose(running):
        before = [list(r.spec_token_ids) for r in running]
        proposal = propose(running)
        assert [r.spec_token_ids for r in running] == before  # the speculator changed no request
        proposals.append(proposal)
        return proposal

    engine.speculator.propose = recording_propose
    while engine.has_unfinished():
        engine.step()
        if proposals and proposals[-1].drafts:
            ((request, drafts),) = proposals[-1].drafts
            assert request.spec_token_ids == drafts  # the engine handed them to the scheduler
    assert any(p.drafts for p in proposals)


def test_failed_proposal_of_a_sequence_ends_its_group(monkeypatch):
    """A parallel-sampling sequence whose proposal fails ends with an error and its group still completes."""
    from testbed.spec.ngram import NgramProposer

    llm = LLM(model="tiny", num_blocks=128, block_size=4, speculative_config=NGRAM)
    propose = NgramProposer.propose

    def poisoned(self, requests, num_tokens):
        if any(r.request_id.startswith("1_") for r in requests):
            raise ValueError("poisoned proposer")
        return propose(self, requests, num_tokens)

    monkeypatch.setattr(NgramProposer, "propose", poisoned)
    params = SamplingParams(temperature=1.0, seed=3, n=2, max_tokens=12, ignore_eos=True)
    (out,) = llm.generate([[7, 8, 9, 10] * 5], params)
    assert out.finished and len(out.outputs) == 2
    reasons = sorted(c.finish_reason for c in out.outputs)
    assert reasons == ["error", "length"]
    engine = llm.engine
    assert not engine.output_processor.groups and not engine.scheduler.requests
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
