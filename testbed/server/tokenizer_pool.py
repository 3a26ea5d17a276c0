"""Tokenization and chat templating in worker threads, so the event loop keeps serving /health and the other
streams while a long prompt is encoded (a 10 MB prompt used to block everything for 11-25 s).

Each worker thread uses its own copy of the tokenizer: a Rust tokenizer used from two threads at once can
fail ("Already borrowed"), and the event loop keeps its own copy for detokenizing (served_model.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class TokenizerPool:
    def __init__(self, tokenizer, threads: int, copy: Callable[[Any], Any]):
        self._tokenizer = tokenizer
        self._copy = copy
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tokenize")

    def _own(self):
        if self._tokenizer is None:
            return None
        tok = getattr(self._local, "tokenizer", None)
        if tok is None:
            tok = self._local.tokenizer = self._copy(self._tokenizer)
        return tok

    async def run(self, fn: Callable, *args):
        """fn(this thread's tokenizer or None, *args) in a worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(self._own(), *args))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
