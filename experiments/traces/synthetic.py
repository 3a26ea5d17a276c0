"""Synthetic workloads: gamma/Poisson arrivals, length distributions, shared system prompts.

Length specs (dicts): {dist: fixed, value}, {dist: uniform, low, high} (inclusive),
{dist: lognormal, mean | median, sigma}, {dist: zipf, a, low, high} (P(k) ~ k^-a on [low, high]);
any of them may add min / max clamps (min defaults to 1).
With prefix_groups > 0 each request gets one of that many shared system prompts of prefix_len
tokens in front of its own prompt_len tokens (total prompt = prefix_len + prompt_len).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .common import Row, finalize, options
from .config import INT64_MAX, check_rate
from .counter_rng import arrival_times, id_list, prefix_tokens, request_tokens
from .tabular import check_horizon
from .types import Trace, TraceError

DEFAULTS = {
    "num_requests": 1000,
    "rate": 10.0,  # req/s; null = all at t=0
    "burstiness": 1.0,  # gamma shape of inter-arrival gaps: 1 = Poisson, < 1 burstier
    "prompt_len": {"dist": "fixed", "value": 512},
    "output_len": {"dist": "fixed", "value": 128},
    "prefix_groups": 0,
    "prefix_len": 0,
}
PARAMS = {
    "fixed": {"value"},
    "uniform": {"low", "high"},
    "lognormal": {"mean", "median", "sigma"},
    "zipf": {"a", "low", "high"},
}


def _bad(key: str, msg: str) -> TraceError:
    return TraceError(msg, "trace config", field=key)


def _num(spec: dict, key: str, name: str) -> float:
    v = spec.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise _bad(f"{name}.{key}", f"must be a finite number, got {v!r}")
    return v


def sample_lengths(spec: Any, n: int, rng: np.random.Generator, name: str) -> np.ndarray:
    """n integer lengths from a spec dict (see module doc)."""
    if not isinstance(spec, dict) or spec.get("dist") not in PARAMS:
        raise _bad(name, f"needs dist in {sorted(PARAMS)}, got {spec!r}")
    dist = spec["dist"]
    extra = set(spec) - PARAMS[dist] - {"dist", "min", "max"}
    if extra:
        raise _bad(name, f"unknown parameter(s) {sorted(extra)} for dist {dist}")
    if dist == "fixed":
        x = np.full(n, _num(spec, "value", name))
    elif dist == "uniform":
        lo, hi = _num(spec, "low", name), _num(spec, "high", name)
        if lo > hi:
            raise _bad(name, f"low {lo} > high {hi}")
        x = rng.integers(int(lo), int(hi) + 1, size=n)
    elif dist == "lognormal":
        sigma = _num(spec, "sigma", name)
        if ("mean" in spec) == ("median" in spec) or sigma < 0:
            raise _bad(name, "lognormal needs exactly one of mean / median, and sigma >= 0")
        # median = e^mu; mean = e^(mu + sigma^2/2)
        centre = _num(spec, "mean" if "mean" in spec else "median", name)
        if centre <= 0:
            raise _bad(name, f"mean/median must be > 0, got {centre}")
        mu = math.log(centre) - (sigma**2 / 2 if "mean" in spec else 0.0)
        x = np.rint(rng.lognormal(mu, sigma, size=n))
    else:
        a, lo, hi = _num(spec, "a", name), int(_num(spec, "low", name)), int(_num(spec, "high", name))
        if not 1 <= lo <= hi or hi - lo > 10_000_000:
            raise _bad(name, f"zipf needs 1 <= low <= high (range <= 1e7), got [{lo}, {hi}]")
        support = np.arange(lo, hi + 1)
        w = support.astype(float) ** -a
        x = rng.choice(support, size=n, p=w / w.sum())
    lo_clamp = _num(spec, "min", name) if "min" in spec else 1
    hi_clamp = _num(spec, "max", name) if "max" in spec else None
    x = np.clip(x, lo_clamp, hi_clamp)
    if (x < 0).any():
        raise _bad(name, f"lengths must be >= 0 (got {x.min()})")
    if (x > INT64_MAX).any():  # would wrap around to negative in int64
        raise _bad(name, f"lengths must fit int64 (got {x.max():.4g})")
    return x.astype(np.int64)


def _count(opts: dict, key: str, low: int) -> int:
    v = opts[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise _bad(key, f"must be an integer >= {low}, got {v!r}")
    return v


def check(opts: dict) -> None:
    """What can be checked before the run (experiments.run.settings): counts, rate, length specs."""
    for key, low in (("num_requests", 1), ("prefix_groups", 0), ("prefix_len", 0)):
        _count(opts, key, low)
    check_rate(opts, "rate")
    for key in ("prompt_len", "output_len"):
        sample_lengths(opts[key], 1, np.random.default_rng(0), key)


def load(cfg: Any, vocab_size: int, max_model_len: int, tokenizer=None) -> Trace:
    opts = options(cfg, DEFAULTS)
    check(opts)
    n, groups, plen = opts["num_requests"], opts["prefix_groups"], opts["prefix_len"]
    if (groups > 0) != (plen > 0):  # the pair is checked on load; each key alone in check()
        raise _bad("prefix_groups", "prefix_groups and prefix_len must both be > 0 or both 0")
    # Independent streams so changing e.g. the output spec does not move the arrivals.
    r_arr, r_in, r_out, r_grp = (np.random.default_rng([opts["seed"], k]) for k in range(4))
    arrivals = arrival_times(r_arr, n, opts["rate"], float(opts["burstiness"]))
    check_horizon(arrivals, [f"request {i}" for i in range(n)], "trace config", "rate", opts["horizon_s"])
    own = sample_lengths(opts["prompt_len"], n, r_in, "prompt_len")
    out = sample_lengths(opts["output_len"], n, r_out, "output_len")
    group = r_grp.integers(0, groups, size=n) if groups else np.full(n, -1)
    seed, low = opts["seed"], opts["token_low"]
    prefixes: dict[int, list[int]] = {}

    def tokens(i: int, g: int):
        if g < 0:
            return None  # own tokens only: finalize batches these

        def build(k: int) -> list[int]:
            if g not in prefixes:
                prefixes[g] = id_list(prefix_tokens(seed, g, plen, vocab_size, low), vocab_size)
            head = prefixes[g][:k]
            tail = request_tokens(seed, i, k - len(head), vocab_size, low, start=len(head))
            return head + id_list(tail, vocab_size)

        return build

    def rows():
        for i in range(n):
            g = int(group[i])
            yield Row(
                index=i,
                arrival_s=float(arrivals[i]),
                prompt_len=int(own[i]) + (plen if g >= 0 else 0),
                output_len=int(out[i]),
                line=f"request {i}",
                meta={"group": g, "own_prompt_len": int(own[i])},
                tokens=tokens(i, g),
            )

    report = {
        "num_requests": n,
        "rate": opts["rate"],
        "burstiness": opts["burstiness"],
        "prompt_len": opts["prompt_len"],
        "output_len": opts["output_len"],
        "prefix_groups": groups,
        "prefix_len": plen,
    }
    return finalize(rows(), opts, path=None, vocab_size=vocab_size, max_model_len=max_model_len, report=report)
