"""ShareGPT: JSON list of {"id", "conversations": [{"from": "human"|"gpt", "value": text}, ...]}.

Prompt = the first human turn tokenised with the caller's tokenizer (real text, real ids);
max_tokens = token count of the first gpt turn after it (or `output_len` if set). There are no
timestamps: arrivals are synthesised (gamma/Poisson at `rate` req/s, or all at 0 when rate is
null). Conversations without a human turn or a reply are skipped and counted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from .common import Row, finalize, options, resolve_path
from .config import check_rate
from .counter_rng import arrival_times
from .tabular import check_horizon
from .types import Trace, TraceError

DEFAULTS = {"path": None, "rate": None, "burstiness": 1.0, "output_len": None, "shuffle": False}
HUMAN = {"human", "user"}
GPT = {"gpt", "assistant", "chatgpt"}


def _encode(tokenizer, text: str, special: bool) -> list[int]:
    try:
        return list(tokenizer.encode(text, add_special_tokens=special))
    except TypeError:  # tokenizers without the HF keyword
        return list(tokenizer.encode(text))


def _prefix(ids: list[int]) -> Callable[[int], list[int]]:
    """The `Row.tokens` builder of a tokenised prompt: its first n ids."""
    return lambda n: ids[:n]


def read_conversations(path) -> list[tuple[int, object, list[dict]]]:
    """[(entry index, id, messages)] of every entry, each message a {"from", "value"} of strings."""
    if not path.is_file():
        raise TraceError("file not found (looked relative to the cwd and the project root)", path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise TraceError(f"malformed JSON: {e.msg} (column {e.colno})", path, e.lineno) from None
    except UnicodeDecodeError as e:
        raise TraceError(f"not UTF-8 text: {e}", path) from None
    except RecursionError:
        raise TraceError("JSON nested too deeply", path) from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise TraceError(f"unreadable JSON value: {e}", path) from None
    if not isinstance(data, list):
        raise TraceError(f"expected a JSON list of conversations, got {type(data).__name__}", path)
    if not data:
        raise TraceError("no conversations (empty list)", path)
    out = []
    for i, entry in enumerate(data):
        where = f"entry {i}"
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list):
            raise TraceError("expected an object with a 'conversations' list", path, where, "conversations")
        for t, turn in enumerate(conv):
            if not (
                isinstance(turn, dict) and isinstance(turn.get("from"), str) and isinstance(turn.get("value"), str)
            ):
                raise TraceError(f"turn {t} needs string 'from' and 'value'", path, where, "conversations")
        out.append((i, entry.get("id"), conv))
    return out


def parse(path) -> tuple[list, int]:
    """[(entry index, id, human text, gpt text)] for usable entries, and the entry count."""
    entries = read_conversations(path)
    usable = []
    for i, cid, conv in entries:
        roles = [turn["from"].lower() for turn in conv]
        h = next((k for k, r in enumerate(roles) if r in HUMAN), None)
        g = None if h is None else next((k for k in range(h + 1, len(roles)) if roles[k] in GPT), None)
        usable.append(
            (
                i,
                cid,
                None if h is None else conv[h]["value"],
                None if g is None else conv[g]["value"],
            )
        )
    return usable, len(entries)


def check(opts: dict) -> None:
    """What can be checked before the file is read (experiments.run.settings)."""
    out_len = opts["output_len"]
    if out_len is not None and (isinstance(out_len, bool) or not isinstance(out_len, int) or out_len < 1):
        raise TraceError(f"must be null or an integer >= 1, got {out_len!r}", "trace config", field="output_len")
    check_rate(opts, "rate")


def load(cfg: Any, vocab_size: int, max_model_len: int, tokenizer=None) -> Trace:
    opts = options(cfg, DEFAULTS)
    check(opts)
    out_len = opts["output_len"]
    if tokenizer is None:
        raise TraceError("ShareGPT needs a tokenizer (prompts are real text)", "trace config", field="tokenizer")
    path = resolve_path(opts["path"])
    entries, n_entries = parse(path)
    skipped = {
        "no_human_turn": sum(e[2] is None for e in entries),
        "no_gpt_turn": sum(e[2] is not None and e[3] is None for e in entries),
    }
    entries = [e for e in entries if e[2] is not None and e[3] is not None]
    rng = np.random.default_rng(opts["seed"])
    if opts["shuffle"]:
        entries = [entries[k] for k in rng.permutation(len(entries))]
    arrivals = arrival_times(rng, len(entries), opts["rate"], float(opts["burstiness"]))
    check_horizon(arrivals, [f"entry {e[0]}" for e in entries], "trace config", "rate", opts["horizon_s"])
    report = {
        "rows_in_file": n_entries,
        "skipped": skipped,
        "rate": opts["rate"],
        "burstiness": opts["burstiness"],
        "shuffle": opts["shuffle"],
    }

    def rows():
        # Lazy: tokenise only what selection reaches (ShareGPT dumps hold ~100k conversations).
        for k, ((i, cid, human, gpt), t) in enumerate(zip(entries, arrivals.tolist())):
            ids = _encode(tokenizer, human, True)
            o = out_len if out_len is not None else len(_encode(tokenizer, gpt, False))
            yield Row(
                index=k,
                arrival_s=t,
                prompt_len=len(ids),
                output_len=o,
                line=f"entry {i}",
                meta={"id": cid, "entry": i},
                tokens=_prefix(ids),
            )

    return finalize(rows(), opts, path=path, vocab_size=vocab_size, max_model_len=max_model_len, report=report)
