"""Replay drivers against a fake engine on a virtual clock (exact timing), and the length policy."""

import pytest

from experiments.replay.driver import Replay
from experiments.results.recorder import Recorder
from experiments.run.runner import apply_length_policy
from experiments.traces import RequestSpec, TraceError
from testbed.outputs import CompletionOutput, RequestMetrics, RequestOutput


class FakeEngine:
    """Every unfinished request gets one token per step; a step takes `dt` on the virtual clock."""

    def __init__(self, dt=0.1, max_len=100):
        self.t, self.dt, self.max_len = 100.0, dt, max_len
        self.reqs, self.step_callbacks, self.sleeps, self.max_in_flight = {}, [], [], 0
        self.validated: dict[str, bool] = {}  # add_request's `validated`, by request id

    def clock(self):
        return self.t

    def sleep(self, s):
        assert not self.has_unfinished(), "slept while the engine had work"
        self.sleeps.append(s)
        self.t += s

    def add_request(self, request_id, prompt_token_ids, params, arrival_time=None, priority=0, validated=False):
        self.validated[request_id] = validated
        if len(prompt_token_ids) + params.max_tokens > self.max_len:
            raise ValueError("too long for the cache")
        self.reqs[request_id] = {
            "arrival": arrival_time,
            "max": params.max_tokens,
            "times": [],
            "done": False,
            "added_at": self.t,
            "prompt": prompt_token_ids,
        }
        self.max_in_flight = max(self.max_in_flight, sum(not r["done"] for r in self.reqs.values()))

    def validate(self, prompt_token_ids, params, request_id):
        """Nothing checked before the run: add_request refuses."""

    def has_unfinished(self):
        return any(not r["done"] for r in self.reqs.values())

    def _out(self, rid, reason):
        r = self.reqs[rid]
        m = RequestMetrics(
            r["arrival"], r["added_at"], r["times"][0] if r["times"] else None, r.get("finish"), list(r["times"]), 0, 0
        )
        return RequestOutput(
            rid, r["prompt"], [CompletionOutput(0, "", [7] * len(r["times"]), None, reason)], True, [], m
        )

    def step(self, horizon=None, sends_on_finish=True):
        self.t += self.dt
        outs = []
        for rid, r in self.reqs.items():
            if r["done"]:
                continue
            r["times"].append(self.t)
            if len(r["times"]) == r["max"]:
                r["done"], r["finish"] = True, self.t
                outs.append(self._out(rid, "length"))
        return outs

    def abort(self, rid):
        r = self.reqs[rid]
        if r["done"]:
            return None
        r["done"], r["finish"] = True, self.t
        return self._out(rid, "abort")


def specs(arrivals, n_tokens=3, prompt=4):
    return [RequestSpec(f"r{i}", a, [100] * prompt, n_tokens, meta={"line": i + 2}) for i, a in enumerate(arrivals)]


def replay(engine, **kw):
    rec = Recorder()
    return Replay.of_engine(engine, rec, sleep=engine.sleep, **kw), rec


def test_offline_all_arrive_at_start():
    eng = FakeEngine()
    r, rec = replay(eng)
    r.run(specs([0.0, 3.0, 9.0]), "offline")
    df = rec.requests_frame()
    assert (df["arrival_time"] == 100.0).all() and eng.sleeps == []
    assert r.start_time == 100.0 and r.end_time == pytest.approx(100.3)
    assert (df["output_tokens"] == 3).all()


def test_open_loop_arrivals_and_idle_sleep():
    eng = FakeEngine(dt=0.1)
    r, rec = replay(eng)
    r.run(specs([0.0, 0.15, 5.0]), "open_loop")
    df = rec.requests_frame().set_index("request_id")
    # scheduled arrival times, even for r1 which came due while a step ran (added at 100.2)
    assert df["arrival_time"].tolist() == pytest.approx([100.0, 100.15, 105.0])
    assert eng.reqs["r1"]["added_at"] == pytest.approx(100.2)
    # the engine went idle after r1 finished (100.5) and slept until r2 was due
    assert len(eng.sleeps) == 1 and eng.sleeps[0] == pytest.approx(4.5)
    assert r.end_time == pytest.approx(105.3) == df["finish_time"].max()


def test_closed_loop_keeps_concurrency():
    eng = FakeEngine()
    r, rec = replay(eng)
    r.run(specs([0.0] * 5, n_tokens=2), "closed_loop", concurrency=2)
    df = rec.requests_frame().set_index("request_id")
    assert eng.max_in_flight == 2 and rec.num_finished == 5
    # a new request is sent when one finishes: r2's arrival is r0's finish
    assert df.loc["r2", "arrival_time"] == pytest.approx(df.loc["r0", "finish_time"])


def test_max_duration_aborts_in_flight():
    eng = FakeEngine(dt=1.0)
    r, rec = replay(eng, max_duration_s=2.5)
    r.run(specs([0.0, 0.0], n_tokens=10), "offline")
    df = rec.requests_frame()
    assert r.timed_out and (df["finish_reason"] == "abort").all()
    assert (df["output_tokens"] == 3).all()


def test_bad_mode_and_concurrency():
    r, _ = replay(FakeEngine())
    with pytest.raises(ValueError, match="unknown replay mode 'poisson'"):
        r.run(specs([0.0]), "poisson")
    with pytest.raises(ValueError, match="replay.concurrency"):
        r.run(specs([0.0]), "closed_loop", concurrency=0)


def test_unrunnable_request_names_the_trace_line():
    r, _ = replay(FakeEngine(max_len=10))
    r.source = "trace.csv"
    with pytest.raises(TraceError, match=r"trace.csv: line 3: field 'length': cannot run on this engine: too long"):
        r.run(specs([0.0, 0.0], n_tokens=3, prompt=4)[:1] + specs([0.0, 0.0], n_tokens=9, prompt=4)[1:], "offline")


def test_length_policy():
    s = [RequestSpec("a", 0.0, list(range(100, 300)), 50), RequestSpec("b", 0.0, [5, 6], 1)]
    out, rep = apply_length_policy(s, {"length_scale": 0.1, "max_prompt_tokens": 16, "max_output_tokens": None})
    assert out[0].prompt_token_ids == list(range(100, 116)) and out[0].max_tokens == 5  # 20 -> cap 16
    assert out[1].prompt_token_ids == [5] and out[1].max_tokens == 1  # ceil, >= 1
    assert rep["clipped_prompts"] == 2 and rep["clipped_outputs"] == 1
    assert rep["prompt_tokens_after"] == 17
    same, rep = apply_length_policy(s, {})
    assert same == s and rep["clipped_prompts"] == 0
    with pytest.raises(ValueError, match="replay.max_output_tokens"):
        apply_length_policy(s, {"max_output_tokens": 0})
    with pytest.raises(ValueError, match="replay.length_scale"):
        apply_length_policy(s, {"length_scale": -1})


def test_ctrl_c_inside_a_step_keeps_the_request_it_finished():
    """Ctrl-C after the engine finished a request but before its output reached the driver: the row is
    filled from the engine's Request, not left empty."""
    from types import SimpleNamespace

    from testbed.request import RequestStatus

    class InterruptedEngine(FakeEngine):
        def add_request(self, request_id, prompt_token_ids, params, arrival_time=None, priority=0, validated=False):
            super().add_request(request_id, prompt_token_ids, params, arrival_time, priority, validated)
            req = SimpleNamespace(
                request_id=request_id,
                status=RequestStatus.RUNNING,
                first_scheduled_time=self.t,
                first_token_time=None,
                finish_time=None,
                output_token_ids=[],
                token_times=[],
                num_cached_tokens=0,
                num_preemptions=0,
            )
            self.reqs[request_id]["req"] = req
            return req

        def step(self, horizon=None, sends_on_finish=True):
            outs = super().step()
            for r in self.reqs.values():
                req = r["req"]
                req.token_times, req.output_token_ids = list(r["times"]), [7] * len(r["times"])
                req.first_token_time = r["times"][0] if r["times"] else None
                if r["done"] and not req.status.finished:
                    req.status, req.finish_time = RequestStatus.FINISHED_LENGTH, r["finish"]
            if outs:
                raise KeyboardInterrupt  # the finished outputs are lost
            return outs

        def abort(self, rid):
            out = super().abort(rid)
            if out is not None:
                self.reqs[rid]["req"].status = RequestStatus.FINISHED_ABORTED
            return out

    eng = InterruptedEngine()
    r, rec = replay(eng)
    with pytest.raises(KeyboardInterrupt):
        r.run(specs([0.0], n_tokens=2) + specs([0.0, 0.0], n_tokens=5)[1:], "offline")
    r.abort_in_flight()
    df = rec.requests_frame().set_index("request_id")
    assert df.loc["r0", "finish_reason"] == "length" and df.loc["r0", "output_tokens"] == 2
    assert df.loc["r0", "finish_time"] == pytest.approx(100.2)
    assert df.loc["r1", "finish_reason"] == "abort"
