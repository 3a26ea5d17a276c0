"""Sessions: multi-turn conversations replayed so that each turn's prompt is the whole history.

A session's turn k+1 is sent `think_s` seconds after turn k finished; its prompt is turn k's prompt, then
the tokens the engine generated for turn k, then the turn's `new_token_ids` (the next user message). So
the reuse a prefix cache sees comes from the engine's own outputs, as in a chat service.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Turn:
    new_token_ids: list[int]  # appended to the history (turn 0: the whole first prompt)
    max_tokens: int  # the answer's length (EOS ignored, as trace replay)
    think_s: float = 0.0  # seconds between the previous turn's finish and this turn's send (turn 0: unused)


@dataclass
class Session:
    session_id: str
    start_s: float  # the first turn's send time on the trace clock
    turns: list[Turn]
    meta: dict = field(default_factory=dict)  # source location (file entry, trace line)


def session_report(sessions: list[Session]) -> dict:
    """Counts a trace_report.json gets for a session workload."""
    turns = [len(s.turns) for s in sessions]
    return {
        "sessions": len(sessions),
        "turns": sum(turns),
        "turns_per_session_mean": sum(turns) / len(turns) if turns else 0.0,
        "turns_per_session_max": max(turns, default=0),
    }
