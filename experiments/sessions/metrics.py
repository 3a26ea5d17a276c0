"""Per-turn metrics of a session replay: the turns table joined with the requests table, and summary keys.

turns.parquet: one row per sent turn: session_id, turn (0-based), think_s, new_tokens, history_tokens (the
previous turn's prompt + answer, the part a prefix cache can hold), prompt_tokens, cached_tokens, ttft_ms
(first token - arrival), finish_reason. The summary gets sessions / turns counts and, per turn index, the
mean TTFT and the mean share of the prompt served from the prefix cache (turn_<k>_ttft_ms,
turn_<k>_cached_share, for the first `MAX_TURN_KEYS` turns; every turn is in turns.parquet).
"""

from __future__ import annotations

import pandas as pd

MAX_TURN_KEYS = 8


def turns_table(turns: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    cols = ["request_id", "cached_tokens", "arrival_time", "first_token_time", "finish_reason"]
    df = turns.merge(requests[cols], on="request_id", how="left")
    df["ttft_ms"] = (df["first_token_time"] - df["arrival_time"]) * 1000.0
    return df.drop(columns=["arrival_time", "first_token_time"])


def session_summary(table: pd.DataFrame, num_sessions: int, turns_cut: int) -> dict:
    done = table[table["finish_reason"].notna() & (table["finish_reason"] != "abort")]
    out: dict = {
        "num_sessions": num_sessions,
        "turns_sent": len(table),
        "turns_cut": turns_cut,
        "later_turn_prefix_hit_rate": _share(done[done["turn"] > 0]),
    }
    for k, g in done.groupby("turn"):
        if k >= MAX_TURN_KEYS:
            break
        out[f"turn_{k}_ttft_ms"] = float(g["ttft_ms"].mean())
        out[f"turn_{k}_cached_share"] = _share(g)
    return out


def _share(g: pd.DataFrame) -> float | None:
    total = g["prompt_tokens"].sum()
    return float(g["cached_tokens"].sum() / total) if total else None
