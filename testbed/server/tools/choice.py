"""tool_choice "required" and named functions as structured output, as vLLM's ChatCompletionRequest
(_get_json_schema_from_tool) builds them: a named function's output is its arguments object; "required"
is a JSON array of one or more {"name": <one of the tools>, "parameters": <that tool's arguments>}."""

from __future__ import annotations

from testbed.server.tools.spec import NamedToolChoice, Tool, parameters_schema


def named_schema(tools: list[Tool], choice: NamedToolChoice) -> dict:
    function = next(t.function for t in tools if t.function.name == choice.function.name)
    return parameters_schema(function)


def required_schema(tools: list[Tool], parallel: bool = True) -> dict:
    def one(tool: Tool) -> dict:
        return {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [tool.function.name]},
                "parameters": parameters_schema(tool.function),
            },
            "required": ["name", "parameters"],
        }

    schema = {"type": "array", "minItems": 1, "items": {"anyOf": [one(t) for t in tools]}}
    if not parallel:  # parallel_tool_calls: false
        schema["maxItems"] = 1
    return schema


def tool_schema(tools: list[Tool] | None, choice, parallel: bool = True) -> dict | None:
    """The JSON schema the output must follow for this tool_choice, or None (none / auto)."""
    if not tools:
        return None
    if isinstance(choice, NamedToolChoice):
        return named_schema(tools, choice)
    if choice == "required":
        return required_schema(tools, parallel)
    return None
