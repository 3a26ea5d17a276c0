"""Grammars as logits masks, through xgrammar (Dong et al. 2024, "XGrammar"; vLLM's default backend).

`GrammarBackend` compiles a request's constraint once (xgrammar caches compiled grammars by their text)
and gives each request its own `GrammarMatcher`. Each step the sampler asks the matchers of the
structured rows in the batch for their next-token bitmasks, applies them to those rows' logits in one
call, and after sampling advances each matcher by the sampled token. The constraints map onto xgrammar
as in vLLM's xgrammar backend (vllm/v1/structured_output/backend_xgrammar.py): a JSON schema and
json_object (schema {"type": "object"}) through `compile_json_schema`, a regex through `compile_regex`,
an EBNF grammar through `compile_grammar`, a choice as the grammar `root ::= "a" | "b"`.

Deviation from vLLM: a constraint is compiled while the request is validated (before admission), so a
malformed or empty-language constraint is a ValueError (HTTP 400) instead of a failure after admission.
"""

from __future__ import annotations

import json
import threading

import torch

from testbed.structured.params import StructuredOutputError, StructuredOutputsParams


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
    """Compiles constraints for one tokenizer; thread-safe (the server validates on its event loop
    while the engine samples on its own thread)."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(set(stop_token_ids))
        self._lock = threading.Lock()
        self._compiler = None
        self._xgr = None

    def _ensure_compiler(self):
        # built on first use: the tokenizer's vocabulary scan takes ~0.3 s, only structured requests need it
        with self._lock:
            if self._compiler is None:
                if self.tokenizer is None:
                    raise StructuredOutputError("structured output needs a model with a tokenizer")
                xgr = _import_xgrammar()
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
                )
                self._xgr, self._compiler = xgr, xgr.GrammarCompiler(info)
        return self._xgr, self._compiler

    def compile(self, params: StructuredOutputsParams):
        """The compiled grammar (cached by xgrammar), or StructuredOutputError naming what is wrong."""
        _, compiler = self._ensure_compiler()
        any_ws = not params.disable_any_whitespace
        try:
            if params.json is not None:
                return compiler.compile_json_schema(json.dumps(params.json), any_whitespace=any_ws)
            if params.json_object:
                return compiler.compile_json_schema('{"type": "object"}', any_whitespace=any_ws)
            if params.regex is not None:
                return compiler.compile_regex(params.regex)
            if params.choice is not None:
                return compiler.compile_grammar(choice_grammar(params.choice))
            return compiler.compile_grammar(params.grammar)
        except RuntimeError as e:  # xgrammar reports every parse/convert failure this way
            raise StructuredOutputError(f"invalid {params.kind} constraint: {_reason(e)}") from e

    def check(self, params: StructuredOutputsParams) -> None:
        """Compile, and refuse a constraint whose language is empty (no token can start it)."""
        matcher = self.new_matcher(params)
        mask = self.allocate_bitmask(1)
        matcher.fill_next_token_bitmask(mask, 0)
        probe = torch.zeros(1, self.vocab_size)
        self.apply_bitmask(probe, mask, [0])
        if not torch.isfinite(probe).any():
            raise StructuredOutputError(f"the {params.kind} constraint cannot be satisfied by any output")

    def new_matcher(self, params: StructuredOutputsParams):
        compiled = self.compile(params)
        return self._xgr.GrammarMatcher(compiled)

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        xgr, _ = self._ensure_compiler()
        return xgr.allocate_token_bitmask(rows, self.vocab_size)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """Set to -inf, in place, every logit a row's grammar forbids."""
        self._xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=rows)


def _reason(error: Exception) -> str:
    """xgrammar's message without its C++ source location prefix."""
    text = str(error).strip().splitlines()
    line = next((t for t in reversed(text) if t.strip()), str(error))
    return line.split(": ", 1)[1] if line.startswith("[") and ": " in line else line
