"""What the server says about the model it serves: its name, context length, vocabulary, tokenizers and prompt
limit."""

from __future__ import annotations

import copy
import logging
import time

from testbed.server import protocol as P
from testbed.server.tokenizer_pool import TokenizerPool
from testbed.structured.params import JSON_MAX_WHITESPACE

logger = logging.getLogger("testbed.server")


def _own_copy(tokenizer):
    """The event loop's own tokenizer: the stepping thread decodes with the engine's (stop strings, final
    text), and a Rust tokenizer used from two threads at once can fail ("Already borrowed")."""
    if tokenizer is None:
        return None
    try:
        return copy.deepcopy(tokenizer)
    except Exception:  # not copyable: share it (plain encode/decode do not mutate it)
        logger.warning("could not copy the tokenizer; sharing the engine's")
        return tokenizer


class ServedModel:
    def __init__(
        self,
        engine,
        served_model_name: str | None = None,
        max_prompt_chars: int = 1_000_000,
        tokenizer_threads: int = 2,
        json_max_whitespace: int | None = JSON_MAX_WHITESPACE,
    ):
        self.name = served_model_name or engine.model_name
        self.tokenizer = _own_copy(engine.tokenizer)  # the event loop's: detokenizing streams, logprobs
        self.tokenizers = TokenizerPool(engine.tokenizer, tokenizer_threads, _own_copy)  # encoding, templates
        self.max_prompt_chars = max_prompt_chars
        self.json_max_whitespace = json_max_whitespace  # the bound every JSON constraint gets (settings)
        self.max_model_len = engine.max_model_len
        self.created = int(time.time())
        # regular vocabulary (no added/special ids) where there is a tokenizer: what traces may draw from
        self.vocab_size = getattr(self.tokenizer, "vocab_size", None) or engine.arch.vocab_size
        # every id the tokenizer knows (added/special ones too): what /detokenize accepts
        self.vocab_limit = len(self.tokenizer) if self.tokenizer is not None else engine.arch.vocab_size

    def model_list(self) -> dict:
        return P.model_list(self.name, self.created, self.max_model_len, self.vocab_size)
