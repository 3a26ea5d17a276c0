"""Tool calling on /v1/chat/completions, as vLLM does it: tools rendered by the chat template (render.py),
tool calls read from the output by a parser chosen by name (parsers.py), tool_choice "required" and named
functions enforced with structured output over the tools' JSON schemas (choice.py), and the reply's
tool_calls, whole or as streaming deltas (reply.py)."""
