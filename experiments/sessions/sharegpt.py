"""ShareGPT conversations as sessions (`trace=sharegpt_sessions`).

Each conversation is a session; each human message followed by a reply is a turn: the message's ids
(experiments.sessions.chat_turns: framed by the model's chat template unless `chat_template` is false)
are the turn's new tokens, the reply's token count its answer length (or `output_len`). The engine's own
answer replaces the recorded reply in the history. The tokenizer is the engine's in process and the
server's /tokenize over HTTP (experiments.sessions.server_tokenizer), so both give the same ids. A
trailing human message without a reply ends the session there; messages of other roles (system, tool)
are skipped; both counted in the report. ShareGPT has no timing: sessions
start at `rate` per second (null: all at 0) and think times are drawn as in trace=sessions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from experiments.traces.config import check_rate, resolve_path
from experiments.traces.counter_rng import arrival_times
from experiments.traces.sharegpt import GPT, HUMAN, read_conversations
from experiments.traces.types import TraceError

from .chat_turns import TurnEncoder
from .synthetic import session_options, think_times
from .types import Session, Turn

DEFAULTS: dict[str, Any] = {
    "name": "sharegpt_sessions",
    "path": None,
    "max_sessions": None,
    "max_turns": None,
    "output_len": None,
    "chat_template": True,
    "rate": None,
    "burstiness": 1.0,
    "think_s": 1.0,
    "think_dist": "exponential",
    "shuffle": False,
    "seed": 0,
}


def _pairs(conv: list[dict]) -> tuple[list[tuple[str, str]], int]:
    """(human, reply) texts in order, and how many messages were skipped."""
    pairs, human, skipped = [], None, 0
    for msg in conv:
        role = msg["from"].lower()
        if role in HUMAN:
            if human is not None:  # two human messages in a row: one message
                human = f"{human}\n{msg['value']}"
            else:
                human = msg["value"]
        elif role in GPT and human is not None:
            pairs.append((human, msg["value"]))
            human = None
        else:
            skipped += 1
    return pairs, skipped + (human is not None)


def check(o: dict) -> None:
    """What can be checked before the file is read (experiments.run.settings)."""
    for key in ("max_sessions", "max_turns", "output_len"):
        v = o[key]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise TraceError(f"must be null or an integer >= 1, got {v!r}", "trace config", field=key)
    if not isinstance(o["chat_template"], bool):
        raise TraceError(f"must be true or false, got {o['chat_template']!r}", "trace config", field="chat_template")
    check_rate(o, "rate")
    think_times(np.random.default_rng(0), 1, o["think_s"], o["think_dist"])


def load(cfg: Any, vocab_size: int, max_model_len: int, tokenizer=None) -> list[Session]:
    o = session_options(cfg, DEFAULTS)
    check(o)
    if tokenizer is None:
        raise TraceError("ShareGPT needs a tokenizer (prompts are real text)", "trace config", field="tokenizer")
    path = resolve_path(o["path"])
    entries = read_conversations(path)
    rng = np.random.default_rng(o["seed"])
    if o["shuffle"]:
        entries = [entries[k] for k in rng.permutation(len(entries))]
    encoder = TurnEncoder(tokenizer, o["chat_template"])
    sessions: list[Session] = []
    for i, cid, conv in entries:
        if o["max_sessions"] is not None and len(sessions) >= o["max_sessions"]:
            break
        pairs, _ = _pairs(conv)
        pairs = pairs[: o["max_turns"]] if o["max_turns"] else pairs
        if not pairs:
            continue
        thinks = think_times(rng, len(pairs), o["think_s"], o["think_dist"])
        turns = []
        for j, (human, reply) in enumerate(pairs):
            out = o["output_len"] or encoder.answer_len(reply)
            turns.append(Turn(encoder.turn_ids(human, j), out, 0.0 if j == 0 else float(thinks[j])))
        sessions.append(Session(f"c{i}", 0.0, turns, {"entry": i, "id": cid}))
    if not sessions:
        raise TraceError("no conversation with a human message and a reply", path)
    starts = arrival_times(rng, len(sessions), o["rate"], float(o["burstiness"]))
    for s, t in zip(sessions, starts.tolist()):
        s.start_s = t
    return sessions
