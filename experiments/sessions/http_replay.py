"""Session replay over HTTP: `python -m experiments.replay.http_replay --url URL replay=sessions trace=sessions`.

Each turn is a streaming /v1/completions request whose prompt is token ids: the previous turn's prompt as
the server saw it, the tokens the server generated for it, then the turn's new tokens. The server returns
both with `return_token_ids` (vLLM's extension, which this server implements), so the history holds the
engine's exact tokens and its prefix cache can serve it back, as in experiments.sessions.replay. A text
history (chat messages) would be re-tokenized and need not reproduce those tokens. Text sources
(trace=sharegpt_sessions) get their turns' ids from the server's /tokenize, framed by its chat template
as experiments.sessions.chat_turns says.

Timing follows experiments.sessions.replay on the client's clock: a session starts at its start_s (at most
`concurrency` sessions active; one that waits starts when a slot frees), turn k+1 is sent think_s after
turn k's last chunk arrived. A turn whose prompt would pass max_prompt_tokens, or prompt + answer the
server's max_model_len, is cut and ends its session (counted in turns_cut). A turn that fails (an HTTP
error, a stream error) is a failed row and ends its session.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from experiments.replay.http_replay import COLUMNS, HttpReplay, TokenIds, _auth_headers, _row, _send, request_body
from experiments.results.recorder import requests_frame
from experiments.traces import RequestSpec

from .replay import TURN_COLUMNS
from .types import Session


@dataclass
class HttpSessionReplay(HttpReplay):
    turns: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=TURN_COLUMNS))
    turns_cut: int = 0
    token_ids: dict[str, TokenIds] = field(default_factory=dict)  # by request id, with keep_token_ids


def turn_spec(session: Session, k: int, prompt: list[int], arrival_s: float, max_output_tokens: int | None):
    turn = session.turns[k]
    max_tokens = min(turn.max_tokens, max_output_tokens or turn.max_tokens)
    meta = {**session.meta, "session": session.session_id, "turn": k}
    return RequestSpec(f"{session.session_id}.t{k}", arrival_s, prompt, max_tokens, meta=meta)


async def replay_sessions_http_async(
    sessions: Sequence[Session],
    base_url: str,
    model: str,
    max_model_len: int,
    api_key: str | None = None,
    concurrency: int | None = None,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    temperature: float = 0.0,
    timeout_s: float | None = 600.0,
    keep_token_ids: bool = False,
) -> HttpSessionReplay:
    import httpx

    bad = isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    if concurrency is not None and bad:
        raise ValueError(f"replay.concurrency: null or an integer >= 1 (active sessions), got {concurrency!r}")
    base = base_url.rstrip("/")
    url = base + ("" if base.endswith("/v1") else "/v1") + "/completions"
    headers = _auth_headers(api_key)
    rows: list[dict] = []
    turn_rows: list[dict] = []
    cut = 0
    kept: dict[str, TokenIds] = {}
    slots = asyncio.Semaphore(concurrency) if concurrency is not None else None
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)

    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as client:
        t0 = time.monotonic()

        async def run_session(session: Session) -> None:
            nonlocal cut
            await asyncio.sleep(max(0.0, t0 + session.start_s - time.monotonic()))
            async with slots if slots is not None else contextlib.nullcontext():
                history: list[int] = []
                for k, turn in enumerate(session.turns):
                    if k:
                        await asyncio.sleep(turn.think_s)
                    prompt = history + list(turn.new_token_ids)
                    now = time.monotonic()
                    spec = turn_spec(session, k, prompt, now - t0, max_output_tokens)
                    too_long = max_prompt_tokens is not None and len(prompt) > max_prompt_tokens
                    if k and (too_long or len(prompt) + spec.max_tokens > max_model_len):
                        cut += 1
                        return
                    row, ids = _row(spec, now), TokenIds()
                    if keep_token_ids:
                        kept[spec.request_id] = ids
                    rows.append(row)
                    turn_rows.append(
                        {
                            "request_id": spec.request_id,
                            "session_id": session.session_id,
                            "turn": k,
                            "think_s": turn.think_s if k else 0.0,
                            "new_tokens": len(turn.new_token_ids),
                            "history_tokens": len(history),
                            "prompt_tokens": len(prompt),
                        }
                    )
                    body = request_body(spec, model, temperature, {"return_token_ids": True})
                    await _send(client, url, headers, spec, body, row, ids)
                    if row["finish_reason"] in ("error", "abort") or ids.generated is None:
                        if ids.generated is None and not row["error"]:
                            row["finish_reason"], row["error"] = "error", "the server returned no token_ids"
                        return
                    history = (ids.prompt if ids.prompt is not None else prompt) + ids.generated

        await asyncio.gather(*(run_session(s) for s in sessions))
    df = requests_frame(rows, COLUMNS)
    finished = df["finish_time"].dropna()
    end = float(finished.max()) if len(finished) else time.monotonic()
    return HttpSessionReplay(df, t0, end, pd.DataFrame(turn_rows, columns=TURN_COLUMNS), cut, kept)


def replay_sessions_http(sessions: Sequence[Session], base_url: str, model: str, **kwargs) -> HttpSessionReplay:
    """Blocking wrapper of replay_sessions_http_async (runs its own event loop)."""
    return asyncio.run(replay_sessions_http_async(sessions, base_url, model, **kwargs))
