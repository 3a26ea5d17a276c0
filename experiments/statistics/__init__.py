"""Repeats, confidence intervals and comparisons of runs."""
