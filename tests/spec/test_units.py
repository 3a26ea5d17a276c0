"""Speculative decoding pieces in isolation: config, n-gram lookup, verification, rejection sampling."""

import math

import pytest
import torch

from testbed.spec import SpeculativeConfig, greedy_verify, rejection_sample
from testbed.spec.metrics import SpecMetrics
from testbed.spec.ngram import ngram_propose

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def chi2_pvalue(observed: torch.Tensor, expected_probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit; cells expected below min_expected are pooled into one."""
    n = observed.sum().double()
    expected = expected_probs.double() * n
    small = expected < min_expected
    obs = torch.cat([observed[~small].double(), observed[small].double().sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = exp > 0
    assert obs[~keep].sum() == 0, "draws where the target has no mass"
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


# ---- config ------------------------------------------------------------------------------------
def test_config_spellings():
    assert not SpeculativeConfig.from_any(None).enabled
    c = SpeculativeConfig.from_any({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})
    assert (c.method, c.num_speculative_tokens, c.prompt_lookup_max) == ("ngram", 4, 3)
    assert SpeculativeConfig.from_any({"model": "tiny"}).method == "draft"  # vLLM infers draft from model
    assert SpeculativeConfig.from_any({"method": "draft_model", "model": "tiny"}).method == "draft"
    assert SpeculativeConfig.from_any({"method": "layerskip", "num_layers": 2, "model": None}).num_layers == 2
    for bad in (
        {"method": "medusa"},
        {"method": "ngram", "num_speculative_tokens": 0},
        {"method": "draft"},
        {"method": "layerskip"},
        {"method": "ngram", "bogus": 1},
        {"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2},
    ):
        with pytest.raises(ValueError):
            SpeculativeConfig.from_any(bad)


# ---- n-gram ------------------------------------------------------------------------------------
def test_ngram_prompt_lookup():
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    assert ngram_propose(tokens, 2, 3, 1) == [4, 5]  # suffix [1 2 3] seen at 0: propose what followed
    assert ngram_propose(tokens, 10, 3, 1) == [4, 5, 9, 1, 2, 3]  # runs to the end of the context
    assert ngram_propose([7, 8, 9], 3, 3, 1) == []  # no earlier occurrence
    # the most recent match wins; longer n-grams are tried first
    assert ngram_propose([5, 1, 6, 5, 1, 7, 5, 1], 1, 2, 1) == [7]
    assert ngram_propose([3, 8, 4, 3], 2, 3, 1) == [8, 4]  # only a 1-gram matches
    assert ngram_propose([3, 8, 4, 3], 2, 3, 2) == []  # ... which prompt_lookup_min=2 forbids
    assert ngram_propose([4], 2, 3, 1) == []
    # a loop: the latest matches run into the end, the latest with k tokens after it is used
    assert ngram_propose([1, 2, 1, 2, 1, 2, 1, 2], 3, 2, 1) == [1, 2, 1]
    assert ngram_propose([9, 9, 9, 9], 3, 3, 1) == [9]  # no match has 3 tokens after it: the earliest


# ---- verification ------------------------------------------------------------------------------
def test_greedy_verify_longest_prefix():
    assert greedy_verify([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]  # all accepted + bonus
    assert greedy_verify([5, 6, 7, 8], [5, 9, 7]) == [5, 6]  # first mismatch: the target's token
    assert greedy_verify([5, 6, 7, 8], [1, 6, 7]) == [5]
    assert greedy_verify([5], []) == [5]


def test_metrics_counts():
    m = SpecMetrics("ngram", 3)
    m.record(3, 3)
    m.record(3, 1)
    m.record(2, 0)
    m.record(0, 0)  # no drafts scheduled: not a verification
    d = m.as_dict()
    assert (d["verifications"], d["drafted"], d["accepted"]) == (3, 8, 4)
    assert d["acceptance_rate"] == pytest.approx(0.5)
    assert d["mean_accepted_length"] == pytest.approx((4 + 2 + 1) / 3)
    # vLLM's definition: accepted at position j / verifications
    assert d["per_position_acceptance_rate"] == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert d["per_position_conditional_acceptance"] == pytest.approx([2 / 3, 1 / 3, 1 / 2])


def test_per_position_acceptance_is_nan_where_never_drafted():
    """A position no draft reached has no acceptance rate (not 0.0, which would read as all rejected)."""
    m = SpecMetrics("ngram", 4)
    assert all(math.isnan(x) for x in m.as_dict()["per_position_acceptance_rate"])  # nothing verified yet
    m.record(2, 1)
    m.record(1, 1)
    d = m.as_dict()
    assert d["per_position_acceptance_rate"][:2] == pytest.approx([1.0, 0.0])
    assert d["per_position_conditional_acceptance"][:2] == pytest.approx([1.0, 0.0])
    for key in ("per_position_acceptance_rate", "per_position_conditional_acceptance"):
        assert all(math.isnan(x) for x in d[key][2:]), key


@pytest.mark.parametrize("deterministic", [False, True], ids=["draft_probs", "one_hot"])
def test_rejection_sampling_reproduces_target(deterministic):
    """Every emitted position j, among draws that reach it, is distributed as p_j (chi-square, fixed seed)."""
    gen = torch.Generator().manual_seed(1234)
    V, k, B = 6, 3, 60_000
    alpha = torch.full((V,), 0.7)
    with torch.random.fork_rng():  # Dirichlet draws from the global generator: fix it, whatever ran before
        torch.manual_seed(1234)
        p = torch.distributions.Dirichlet(alpha).sample((k + 1,))  # target at k positions + bonus
        q = torch.distributions.Dirichlet(alpha).sample((k,))  # a draft that disagrees with it
    p[0, 2] = 0.0  # a token the target never emits...
    p[0] /= p[0].sum()
    q[0, 2] = max(float(q[0, 2]), 0.3)  # ...that the draft likes
    q[0] /= q[0].sum()
    if deterministic:  # one fixed draft sequence (each position's most likely target token), q = one-hot
        drafts = p[:k].argmax(dim=1).unsqueeze(0).repeat(B, 1)
        draft_probs = None
    else:
        drafts = torch.stack([torch.multinomial(q[j], B, replacement=True, generator=gen) for j in range(k)], 1)
        draft_probs = q.unsqueeze(0).expand(B, k, V)
    target = p.unsqueeze(0).expand(B, k + 1, V)
    tokens, num_acc = rejection_sample(target, drafts, draft_probs, gen)
    assert ((tokens >= 0).sum(1) == num_acc + 1).all()
    for j in range(k + 1):
        reached = num_acc >= j  # position j is emitted iff j drafts were accepted
        assert reached.sum() > 1000
        counts = torch.bincount(tokens[reached, j], minlength=V)
        assert counts[p[j] == 0].sum() == 0
        pval = chi2_pvalue(counts, p[j])
        assert pval > 1e-3, f"position {j}: chi-square p-value {pval:.2e}"
        tv = 0.5 * (counts / counts.sum() - p[j]).abs().sum()
        assert tv < 0.02, f"position {j}: total variation {tv:.3f}"
    # acceptance at position 0 is sum(min(p, q)) for a sampled draft, p(d) for a fixed one
    expected = float(torch.minimum(p[0], q[0]).sum()) if not deterministic else float(p[0, drafts[0, 0]])
    assert float((num_acc >= 1).double().mean()) == pytest.approx(expected, abs=0.01)


def test_rejection_sample_respects_accepted_prefix():
    # p puts all mass on the drafts: all accepted, bonus from the last row
    V = 4
    p = torch.zeros(1, 3, V)
    p[0, 0, 1] = p[0, 1, 2] = p[0, 2, 3] = 1.0
    tokens, n = rejection_sample(p, torch.tensor([[1, 2]]), None)
    assert n.tolist() == [2] and tokens.tolist() == [[1, 2, 3]]
    # p gives no mass to the first draft: rejected, resampled from the rest
    tokens, n = rejection_sample(p, torch.tensor([[0, 2]]), None)
    assert n.tolist() == [0] and tokens.tolist() == [[1, -1, -1]]
