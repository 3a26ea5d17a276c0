"""Structured output: per-request grammars (JSON schema, regex, choice, EBNF) as logits masks, via xgrammar."""

from testbed.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
