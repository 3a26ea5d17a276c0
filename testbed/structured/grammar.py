"""Grammars as logits masks, through xgrammar (Dong et al. 2024, "XGrammar"; vLLM's default backend).

`GrammarBackend` compiles a request's constraint once (xgrammar caches compiled grammars by their text)
and gives each request its own `GrammarMatcher`. Each step the sampler asks the matchers of the
structured rows in the batch for their next-token bitmasks, applies them to those rows' logits in one
call, and after sampling advances each matcher by the sampled token. The constraints map onto xgrammar
as in vLLM's xgrammar backend (vllm/v1/structured_output/backend_xgrammar.py): a JSON schema and
json_object (schema {"type": "object"}) through `compile_json_schema`, a regex through `compile_regex`,
an EBNF grammar through `compile_grammar`, a choice as the grammar `root ::= "a" | "b"`.

Compiles run in a bounded pool of worker threads (xgrammar releases the GIL while compiling), never on the
engine's stepping thread or the server's event loop, each within `compile_timeout_s`; the constraint is
first checked for size and for what xgrammar would not enforce (constraint_check.py). The compiled
grammar stays with the request's StructuredOutputsParams, so the sampler's matcher never recompiles, and
xgrammar's cache of compiled grammars is bounded by `cache_bytes` (limits.py).

Deviation from vLLM: a constraint is compiled while the request is validated (before admission), so a
malformed, oversized or empty-language constraint is a ValueError (HTTP 400) instead of a failure after
admission; vLLM compiles after admission and holds the request until its grammar is ready.
"""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from types import ModuleType

import torch

from testbed.structured.constraint_check import check_constraint
from testbed.structured.limits import StructuredOutputsConfig
from testbed.structured.params import StructuredOutputError, StructuredOutputsParams
from testbed.structured.productive import never_finishing_rules


def _import_xgrammar():
    try:
        import xgrammar
    except ImportError as e:  # an optional dependency of the engine library
        raise StructuredOutputError("structured output needs the xgrammar package (pip install xgrammar)") from e
    return xgrammar


def choice_grammar(choice: list[str]) -> str:
    """`root ::= "a" | "b"`: each choice a JSON-escaped EBNF string literal (quotes, backslashes, newlines)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choice)


class GrammarBackend:
    """Compiles constraints for one tokenizer; thread-safe (the server compiles from its event loop through
    the pool while the engine samples on its own thread)."""

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        stop_token_ids: list[int],
        config: StructuredOutputsConfig | dict | None = None,
        max_model_len: int | None = None,
    ):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(set(stop_token_ids))
        self.config = StructuredOutputsConfig.from_any(config)
        self.max_model_len = max_model_len
        self.max_output_chars: int | None = None  # max_model_len x the longest token's characters
        self._lock = threading.Lock()
        self._compiler = None
        self._xgr: ModuleType | None = None  # xgrammar, imported with the compiler
        self._pool: ThreadPoolExecutor | None = None
        self._ready: Future | None = None

    def _ensure_compiler(self):
        # built on first use (in a worker): the vocabulary scan takes ~0.3 s, only structured requests need it
        with self._lock:
            if self._compiler is None:
                if self.tokenizer is None:
                    raise StructuredOutputError("structured output needs a model with a tokenizer")
                xgr = _import_xgrammar()
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
                )
                if self.max_model_len is not None:
                    longest = max((len(t) for t in self.tokenizer.get_vocab()), default=1)
                    self.max_output_chars = self.max_model_len * max(longest, 1)
                # one thread per compile: compile_threads bounds the cores compiling at once
                compiler = xgr.GrammarCompiler(info, max_threads=1, cache_limit_bytes=self.config.cache_bytes)
                self._xgr, self._compiler = xgr, compiler
        return self._xgr, self._compiler

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.config.compile_threads, thread_name_prefix="grammar-compile")
            return self._pool

    def cache_size_bytes(self) -> int:
        """Memory held by xgrammar's cache of compiled grammars (at most config.cache_bytes)."""
        return self._compiler.get_cache_size_bytes() if self._compiler is not None else 0

    # ---- compiling ----------------------------------------------------------------------------------
    def _attached(self, params: StructuredOutputsParams):
        owner, compiled = params._compiled
        return compiled if owner is self else None

    def ready(self) -> Future:
        """Builds the compiler (the tokenizer's vocabulary scan) once, in the pool; not counted in any
        request's compile budget."""
        pool = self._executor()
        with self._lock:
            if self._ready is None:
                self._ready = pool.submit(self._ensure_compiler)
            return self._ready

    def submit(self, params: StructuredOutputsParams) -> Future:
        """Check the constraint here (cheap), compile it in the pool; the Future's result is the compiled
        grammar, also kept on params (or StructuredOutputError). Call once ready() is done."""
        compiled = self._attached(params)
        if compiled is not None:
            done: Future = Future()
            done.set_result(compiled)
            return done
        check_constraint(params, self.config, self.max_output_chars)
        return self._executor().submit(self._compile_checked, params)

    def _timeout_error(self, params: StructuredOutputsParams) -> StructuredOutputError:
        return StructuredOutputError(
            f"compiling the {params.kind} constraint took longer than {self.config.compile_timeout_s:g} s "
            "(structured_outputs.compile_timeout_s); simplify or shorten it"
        )

    def compile(self, params: StructuredOutputsParams):
        """The compiled grammar, waiting at most compile_timeout_s (StructuredOutputError otherwise)."""
        if self._attached(params) is None:
            self.ready().result()
        future = self.submit(params)
        try:
            return future.result(timeout=self.config.compile_timeout_s)
        except FutureTimeout:
            future.cancel()  # frees its place in the queue if it has not started
            raise self._timeout_error(params) from None

    async def compile_async(self, params: StructuredOutputsParams):
        """compile() for an event loop: the loop keeps serving while the pool compiles."""
        if self._attached(params) is None:
            await asyncio.wrap_future(self.ready())
        future = self.submit(params)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.config.compile_timeout_s)
        except asyncio.TimeoutError:
            raise self._timeout_error(params) from None

    def _compile_checked(self, params: StructuredOutputsParams):
        """In a worker: refuse a language with no finite output, compile, refuse an empty language, keep the
        result on params."""
        xgr, compiler = self._ensure_compiler()
        with _as_constraint_error(params):
            _refuse_endless(xgr, params)
            compiled = self._compile_now(compiler, params)
        matcher = xgr.GrammarMatcher(compiled)
        mask = xgr.allocate_token_bitmask(1, self.vocab_size)
        matcher.fill_next_token_bitmask(mask, 0)
        probe = torch.zeros(1, self.vocab_size)
        xgr.apply_token_bitmask_inplace(probe, mask)
        if not torch.isfinite(probe).any():
            raise StructuredOutputError(f"the {params.kind} constraint cannot be satisfied by any output")
        params._compiled = (self, compiled)
        return compiled

    @staticmethod
    def _compile_now(compiler, params: StructuredOutputsParams):
        any_ws = not params.disable_any_whitespace
        ws = {"any_whitespace": any_ws, "max_whitespace_cnt": params.max_whitespace if any_ws else None}
        if params.json is not None:
            return compiler.compile_json_schema(json.dumps(params.json), **ws)
        if params.json_object:
            return compiler.compile_json_schema('{"type": "object"}', **ws)
        if params.regex is not None:
            return compiler.compile_regex(params.regex)
        if params.choice is not None:
            return compiler.compile_grammar(choice_grammar(params.choice))
        return compiler.compile_grammar(params.grammar)

    def check(self, params: StructuredOutputsParams) -> None:
        """Compile (or find compiled) and refuse an empty language: StructuredOutputError."""
        self.compile(params)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def _xgrammar(self) -> ModuleType:
        if self._xgr is None:
            raise RuntimeError("xgrammar is imported when the first grammar compiles")
        return self._xgr

    def new_matcher(self, params: StructuredOutputsParams):
        compiled = self.compile(params)
        return self._xgrammar.GrammarMatcher(compiled)

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        xgr, _ = self._ensure_compiler()
        return xgr.allocate_token_bitmask(rows, self.vocab_size)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """Set to -inf, in place, every logit a row's grammar forbids."""
        self._xgrammar.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=rows)


def _refuse_endless(xgr, params: StructuredOutputsParams) -> None:
    """A grammar or regex whose language holds no finite string would generate until max_tokens. Checked on
    xgrammar's uncompiled grammar (small: no automata yet), before the compile is paid for. JSON schemas:
    schema_check.py refuses their unavoidable $ref cycles; a choice is a finite list."""
    if params.grammar is not None:
        source = xgr.Grammar.from_ebnf(params.grammar)
    elif params.regex is not None:
        source = xgr.Grammar.from_regex(params.regex)
    else:
        return
    endless = never_finishing_rules(source)
    if endless:
        names = ", ".join(endless[:5]) + (", ..." if len(endless) > 5 else "")
        raise StructuredOutputError(
            f"the {params.kind} constraint cannot be satisfied by any finite output: "
            f"{'rules' if len(endless) > 1 else 'rule'} {names} never {'end' if len(endless) > 1 else 'ends'} "
            "(each alternative needs a rule that never ends), so generation would run until max_tokens"
        )


@contextmanager
def _as_constraint_error(params: StructuredOutputsParams):
    try:
        yield
    except RuntimeError as e:  # xgrammar reports every parse/convert failure this way
        raise StructuredOutputError(f"invalid {params.kind} constraint: {_reason(e)}") from e
    except RecursionError:
        raise StructuredOutputError(f"the {params.kind} constraint is nested too deeply") from None


def _reason(error: Exception) -> str:
    """xgrammar's message without its C++ source location prefix."""
    text = str(error).strip().splitlines()
    line = next((t for t in reversed(text) if t.strip()), str(error))
    return line.split(": ", 1)[1] if line.startswith("[") and ": " in line else line
