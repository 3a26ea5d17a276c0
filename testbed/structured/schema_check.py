"""Checks on a JSON schema before it is compiled: what xgrammar would silently not enforce, what no finite
output can satisfy, and what would exhaust a recursive walk. Each is a StructuredOutputError naming the
keyword and where it is (a JSON pointer).

- nesting deeper than `max_schema_depth` (checked first, iteratively, so the walks below may recurse);
- `$ref` other than a local JSON pointer (`#/...`): remote and file references are refused and never
  fetched or read; a local one that does not resolve;
- `allOf` with more than one subschema: xgrammar 0.2 does not intersect them (its grammar falls back to
  any JSON value), so the constraint would not hold;
- a lower bound (minLength, minItems, minProperties, minContains) needing more characters than the model
  can write in its whole context (`max_output_chars`);
- a `$ref` cycle every instance must follow (a required property, an item of a non-empty array, every
  branch of an anyOf/oneOf): no finite JSON matches it.
"""

from __future__ import annotations

from urllib.parse import unquote

from testbed.structured.params import StructuredOutputError

MIN_BOUNDS = ("minLength", "minItems", "minProperties", "minContains")
_DEFS = ("$defs", "definitions")


def check_json_schema(schema, max_depth: int, max_output_chars: int | None) -> None:
    check_depth(schema, max_depth)
    if not isinstance(schema, dict):
        return
    for path, node in _schemas(schema):
        _check_node(schema, path, node, max_output_chars)
    _check_required_cycles(schema)


def check_depth(schema, max_depth: int) -> None:
    stack = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise StructuredOutputError(
                f"the JSON schema is nested more than {max_depth} levels deep (structured_outputs.max_schema_depth)"
            )
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def _schemas(schema: dict):
    """(JSON pointer, node) for every dict in the schema, the root first (iterative)."""
    stack: list[tuple[str, dict | list]] = [("#", schema)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            yield path, node
            stack.extend((f"{path}/{_escape(k)}", v) for k, v in node.items() if isinstance(v, (dict, list)))
        else:
            stack.extend((f"{path}/{i}", v) for i, v in enumerate(node) if isinstance(v, (dict, list)))


def _escape(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _check_node(root: dict, path: str, node: dict, max_output_chars: int | None) -> None:
    ref = node.get("$ref")
    if ref is not None:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise StructuredOutputError(
                f"$ref {ref!r} at {path}: only local references (#/...) are supported; "
                "remote and file references are never fetched"
            )
        if resolve(root, ref) is None:
            raise StructuredOutputError(f"$ref {ref!r} at {path} does not resolve within the schema")
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        raise StructuredOutputError(
            f"allOf with {len(all_of)} subschemas at {path} is not supported (the grammar backend does not "
            "intersect them, so the constraint would not hold); merge them into one schema"
        )
    if max_output_chars is not None:
        for key in MIN_BOUNDS:
            bound = node.get(key)
            if isinstance(bound, (int, float)) and not isinstance(bound, bool) and bound > max_output_chars:
                raise StructuredOutputError(
                    f"{key}={bound} at {path} cannot be met: the model's whole context holds at most "
                    f"{max_output_chars} characters"
                )


def resolve(root: dict, ref: str):
    """The node a local `#/a/b` pointer names, or None."""
    node = root
    pointer = ref[1:]
    if not pointer:
        return root
    if not pointer.startswith("/"):
        return None
    for part in pointer[1:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _must_refs(node) -> set[str]:
    """The $refs every instance of this schema must go through (not following them)."""
    if not isinstance(node, dict):
        return set()
    refs = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
    props = node["properties"] if isinstance(node.get("properties"), dict) else {}
    required = node["required"] if isinstance(node.get("required"), list) else []
    for name in required:
        if isinstance(name, str) and name in props:
            refs |= _must_refs(props[name])
    min_items = node.get("minItems", 0)
    if isinstance(min_items, int) and min_items >= 1:
        prefix = node["prefixItems"] if isinstance(node.get("prefixItems"), list) else []
        for item in prefix[:min_items]:
            refs |= _must_refs(item)
        if min_items > len(prefix):
            refs |= _must_refs(node.get("items"))
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list) and branches:
            common = _must_refs(branches[0])
            for b in branches[1:]:
                common &= _must_refs(b)
            refs |= common
    if isinstance(node.get("allOf"), list):
        for sub in node["allOf"]:
            refs |= _must_refs(sub)
    return refs


def _check_required_cycles(root: dict) -> None:
    """A cycle among the refs reachable from the root through required edges (iterative DFS)."""
    edges: dict[str, set[str]] = {}

    def out(ref: str) -> set[str]:
        if ref not in edges:
            edges[ref] = _must_refs(resolve(root, ref)) if ref.startswith("#") else set()
        return edges[ref]

    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in _must_refs(root):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(out(start))))]
        state[start] = 1
        while stack:
            ref, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[ref] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                raise StructuredOutputError(
                    f"$ref {nxt!r} requires itself without end (through required properties or non-empty "
                    "arrays): no finite JSON value matches the schema"
                )
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(sorted(out(nxt)))))
