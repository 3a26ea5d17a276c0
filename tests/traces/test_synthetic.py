"""Synthetic workloads: arrival process, length distributions, shared system prompts."""

import numpy as np
import pytest

from experiments.traces import TraceError, load_trace

V, M = 32000, 1 << 16


def load(M=M, **kw):
    return load_trace({"name": "synthetic", **kw}, vocab_size=V, max_model_len=M)


def test_defaults_fixed_lengths_poisson():
    tr = load(
        num_requests=3000,
        rate=20.0,
        prompt_len={"dist": "fixed", "value": 16},
        output_len={"dist": "fixed", "value": 4},
    )
    assert len(tr) == 3000 and tr[0].arrival_s == 0
    assert {r.prompt_len for r in tr} == {16} and {r.max_tokens for r in tr} == {4}
    gaps = np.diff([r.arrival_s for r in tr])
    assert gaps.mean() == pytest.approx(0.05, rel=0.08) and gaps.std() / gaps.mean() == pytest.approx(1, rel=0.1)


def test_burstiness_is_gamma_shape():
    tr = load(num_requests=3000, rate=10.0, burstiness=0.25, prompt_len={"dist": "fixed", "value": 2})
    gaps = np.diff([r.arrival_s for r in tr])
    assert gaps.mean() == pytest.approx(0.1, rel=0.15)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.15)  # CV = 1/sqrt(shape)


def test_all_at_zero_and_determinism():
    a = load(num_requests=20, rate=None, prompt_len={"dist": "uniform", "low": 5, "high": 9})
    assert all(r.arrival_s == 0 for r in a)
    assert {r.prompt_len for r in a} <= set(range(5, 10))
    b = load(num_requests=20, rate=None, prompt_len={"dist": "uniform", "low": 5, "high": 9})
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b]
    c = load(num_requests=20, rate=None, seed=1, prompt_len={"dist": "uniform", "low": 5, "high": 9})
    assert [r.prompt_token_ids for r in a] != [r.prompt_token_ids for r in c]


def test_lognormal_and_zipf():
    ln = load(
        num_requests=4000,
        prompt_len={"dist": "lognormal", "mean": 200, "sigma": 0.5},
        output_len={"dist": "lognormal", "median": 50, "sigma": 0.8, "max": 300},
    )
    p = np.array([r.prompt_len for r in ln])
    o = np.array([r.max_tokens for r in ln])
    assert p.mean() == pytest.approx(200, rel=0.05)
    assert np.median(o) == pytest.approx(50, rel=0.1) and o.max() <= 300 and o.min() >= 1
    z = load(
        num_requests=4000,
        output_len={"dist": "zipf", "a": 1.5, "low": 1, "high": 100},
        prompt_len={"dist": "fixed", "value": 2},
    )
    o = np.array([r.max_tokens for r in z])
    assert o.min() >= 1 and o.max() <= 100
    assert (o == 1).mean() > (o == 2).mean() > (o == 4).mean()
    assert (o == 1).mean() == pytest.approx(1 / sum(k**-1.5 for k in range(1, 101)), rel=0.1)


def test_shared_system_prompts():
    tr = load(num_requests=60, prefix_groups=3, prefix_len=32, prompt_len={"dist": "uniform", "low": 1, "high": 20})
    by_group = {}
    for r in tr:
        assert r.prompt_len == 32 + r.meta["own_prompt_len"]
        by_group.setdefault(r.meta["group"], []).append(r.prompt_token_ids)
    assert sorted(by_group) == [0, 1, 2]
    heads = {g: {tuple(p[:32]) for p in ps} for g, ps in by_group.items()}
    assert all(len(h) == 1 for h in heads.values())  # same group -> same prefix
    assert len({next(iter(h)) for h in heads.values()}) == 3  # groups differ
    tails = [tuple(p[32:36]) for ps in by_group.values() for p in ps if len(p) >= 36]
    assert len(set(tails)) == len(tails)  # own parts differ


def test_overlength_clip_keeps_prefix():
    tr = load(
        num_requests=10,
        prefix_groups=1,
        prefix_len=50,
        M=40,
        prompt_len={"dist": "fixed", "value": 10},
        output_len={"dist": "fixed", "value": 5},
    )
    assert all(r.prompt_len == 35 and r.max_tokens == 5 for r in tr)
    assert len({tuple(r.prompt_token_ids) for r in tr}) == 1  # all clipped into the shared prefix
    assert tr.report["clipped"]["overlength"] == 10 and tr.report["clipped"]["prompt_tokens"] == 250


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"prompt_len": {"dist": "normal", "mean": 3}}, "prompt_len"),
        ({"prompt_len": {"dist": "uniform", "low": 9, "high": 3}}, "prompt_len"),
        ({"prompt_len": {"dist": "lognormal", "sigma": 1}}, "prompt_len"),
        ({"output_len": {"dist": "fixed", "value": "ten"}}, "output_len.value"),
        ({"output_len": {"dist": "fixed", "value": 3, "scale": 2}}, "output_len"),
        ({"output_len": {"dist": "zipf", "a": 1.2, "low": 0, "high": 5}}, "output_len"),
        ({"num_requests": 0}, "num_requests"),
        ({"prefix_groups": 2}, "prefix_groups"),
        ({"rate": -3.0}, "rate"),
        ({"max_request": 3}, None),
    ],
)
def test_bad_config(kw, field):
    with pytest.raises(TraceError) as e:
        load(**kw)
    assert e.value.field == field
