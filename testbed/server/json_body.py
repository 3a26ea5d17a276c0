"""A request body as a JSON object, every way it can be bad a 400 with an OpenAI-style body (never a 500):
malformed JSON or bytes that are not UTF-8, nesting too deep for the parser (RecursionError), integers of
more digits than Python converts (ValueError), and strings holding unpaired UTF-16 surrogates (`"\\ud800"`
is valid JSON, but such a string cannot be tokenized, encoded into a response or logged)."""

from __future__ import annotations

import json

from testbed.server import protocol as P


def _invalid(message: str, code: str | None = "invalid_json") -> P.APIError:
    return P.APIError(message, 400, code=code)


def parse_json_object(body: bytes) -> dict:
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _invalid(f"malformed JSON body: {e}") from None
    except RecursionError:
        raise _invalid("malformed JSON body: nested too deeply") from None
    except ValueError as e:  # the only other ValueError json raises: an integer past int_max_str_digits
        raise _invalid(f"malformed JSON body: {e}") from None
    if not isinstance(data, dict):
        raise _invalid(f"the body must be a JSON object, got {type(data).__name__}", code=None)
    where = first_invalid_string(data)
    if where is not None:
        top = where.split(".")[0]
        raise P.APIError(
            f"invalid Unicode in {where or 'the body'}: an unpaired UTF-16 surrogate",
            400,
            param=top if top and top != "<key>" else None,
            code="invalid_unicode",
        )
    return data


def _valid(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def first_invalid_string(data) -> str | None:
    """The dotted path of the first string that is not valid Unicode (a bad key shows as `<key>`), None if
    there is none. Iterative: the parser has already bounded the depth, but the walk must not recurse."""
    stack: list[tuple[str, object]] = [("", data)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            if not _valid(node):
                return path
        elif isinstance(node, dict):
            for key, value in node.items():
                if not _valid(key):
                    return f"{path}.<key>" if path else "<key>"
                stack.append((f"{path}.{key}" if path else key, value))
        elif isinstance(node, list):
            stack.extend((f"{path}.{i}", v) for i, v in enumerate(node))
    return None
