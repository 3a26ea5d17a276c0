"""Does a compiled grammar accept any finite output? The "generating symbols" analysis of a context-free
grammar (Hopcroft, Motwani & Ullman, "Introduction to Automata Theory", sec. 7.1.2): a rule generates a
finite string when one of its alternatives is made only of terminals and rules that do. A grammar whose
root generates none (`root ::= "x" a; a ::= "y" a`) would let a request generate until max_tokens, so it
is refused. Regexes and JSON schemas are compiled to grammars by xgrammar, so the same check covers them
(for a regex it is "an accepting state is reachable").

It reads the grammar xgrammar compiled (`Grammar.serialize_json()`, format version FORMAT), not the
user's text, so it sees exactly what the matcher enforces. Expression kinds follow xgrammar's
GrammarExprType order. Deviation, on the safe side: lookahead assertions and kinds this module does not
know (tag dispatch, tokens) count as generating, so the check can miss an empty language there but never
refuses a grammar that has a finite output.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque

FORMAT = "v18"  # xgrammar 0.2.x

BYTE_STRING, CHAR_CLASS, CHAR_CLASS_STAR, EMPTY_STR, RULE_REF, SEQUENCE, CHOICES, TAG_DISPATCH, REPEAT = range(9)


class _Exprs:
    """xgrammar's expressions: rows [kind, length, data...] laid end to end, indptr their starts."""

    def __init__(self, data: list[int], indptr: list[int]):
        self.data, self.indptr = data, indptr

    def kind_and_args(self, expr: int) -> tuple[int, list[int]]:
        start = self.indptr[expr]
        return self.data[start], self.data[start + 2 : start + 2 + self.data[start + 1]]

    def referenced_rules(self, expr: int) -> set[int]:
        kind, args = self.kind_and_args(expr)
        if kind == RULE_REF:
            return {args[0]}
        if kind == REPEAT:
            return {args[0]}
        if kind in (SEQUENCE, CHOICES):
            return set().union(*(self.referenced_rules(e) for e in args)) if args else set()
        return set()

    def generates(self, expr: int, generating: set[int]) -> bool:
        kind, args = self.kind_and_args(expr)
        if kind == RULE_REF:
            return args[0] in generating
        if kind == REPEAT:  # [rule, min, max]
            return args[1] == 0 or args[0] in generating
        if kind == SEQUENCE:
            return all(self.generates(e, generating) for e in args)
        if kind == CHOICES:
            return any(self.generates(e, generating) for e in args)
        if kind == CHAR_CLASS:  # [negated, lo, hi, ...]: a non-negated class with no range matches nothing
            return bool(args[0]) or len(args) > 1
        return True  # strings, class stars, the empty string; unknown kinds on the safe side


def never_finishing_rules(grammar) -> list[str] | None:
    """The names of the rules reachable from the root that generate no finite string when the root is
    one of them (the grammar's language has no finite output), else None. None as well for a
    serialization format this module does not know."""
    doc = json.loads(grammar.serialize_json())
    if doc.get("__VERSION__") != FORMAT:
        return None
    exprs = _Exprs(doc["grammar_expr_data"], doc["grammar_expr_indptr"])
    rules = doc["rules"]  # [name, body expr, lookahead expr, ...]
    uses = [exprs.referenced_rules(rule[1]) for rule in rules]
    used_by: dict[int, list[int]] = defaultdict(list)
    for rule_id, refs in enumerate(uses):
        for ref in refs:
            used_by[ref].append(rule_id)
    generating: set[int] = set()
    pending = deque(range(len(rules)))
    while pending:  # a rule is re-checked only when a rule it uses becomes generating
        rule_id = pending.popleft()
        if rule_id not in generating and exprs.generates(rules[rule_id][1], generating):
            generating.add(rule_id)
            pending.extend(used_by[rule_id])
    root = doc["root_rule_id"]
    if root in generating:
        return None
    reachable, stack = {root}, [root]
    while stack:
        for ref in uses[stack.pop()]:
            if ref not in reachable:
                reachable.add(ref)
                stack.append(ref)
    return [rules[r][0] for r in sorted(reachable) if r not in generating]
