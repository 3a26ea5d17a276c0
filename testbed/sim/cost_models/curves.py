"""Measured 1-D cost curves ({"x": [...], "seconds": [...]}, x ascending), read piecewise linearly: the operator
model's linear layers, norms and logits (operators.py), and the profile's linear-layer shape (profile.py)."""

import numpy as np


def interpolate(curve: dict, x: float) -> float:
    """Piecewise linear in x over the grid; beyond it, the nearest segment's slope (never below zero)."""
    xs, ts = curve["x"], curve["seconds"]
    if len(xs) == 1 or xs[0] <= x <= xs[-1]:
        return float(np.interp(x, xs, ts))
    i = 0 if x < xs[0] else len(xs) - 2
    slope = (ts[i + 1] - ts[i]) / (xs[i + 1] - xs[i])
    edge = 0 if x < xs[0] else len(xs) - 1
    return max(0.0, ts[edge] + slope * (x - xs[edge]))
