"""Shared fixtures for the trace loader tests (no __init__.py: pytest imports this per dir)."""

import zlib
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
# The repo is /work/main and the shared data /work/shared: parents[3] of this file is /work.
SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"


class WordTokenizer:
    """Deterministic stand-in for an HF tokenizer: one id per word, BOS = 1."""

    vocab_size = 5100

    def encode(self, text, add_special_tokens=True):
        ids = [100 + zlib.crc32(w.encode()) % 5000 for w in text.split()]
        return ([1] if add_special_tokens else []) + ids


@pytest.fixture
def fixtures():
    return FIXTURES


@pytest.fixture
def tok():
    return WordTokenizer()


@pytest.fixture
def shared():
    if not SHARED.is_dir():
        pytest.skip(f"real traces not present at {SHARED}")
    return SHARED


@pytest.fixture
def write(tmp_path):
    """write(name, text) -> path of a temp file with that content."""

    def _write(name, text):
        p = tmp_path / name
        p.write_text(text, encoding="utf-8")
        return p

    return _write
