"""Imports go one way: benchmarks/ -> experiments/ -> testbed/ (the library needs neither the runner nor
the benchmarks; the runner's shared helpers live in experiments, once)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_packages(folder: Path) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                out.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return out


@pytest.mark.parametrize(
    ("folder", "forbidden"), [("testbed", {"experiments", "benchmarks"}), ("experiments", {"benchmarks"})]
)
def test_no_import_against_the_direction(folder, forbidden):
    found = imported_packages(ROOT / folder)
    assert not {p: sorted(found[p]) for p in forbidden if p in found}
