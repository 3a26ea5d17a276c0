"""benchmarks.kv_pages: both block-table layouts measured on both page sizes, every alternation kept, and
the pair of result files written."""

import json
import shutil

import pytest

from benchmarks.kv_pages import main

pytestmark = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None,
    reason="kernel=cpu builds its kernels with a C++ compiler",
)


def test_kv_pages_measures_each_layout_on_both_page_sizes(tmp_path):
    args = ["--layers", "2", "--blocks", "1400", "--rounds", "2", "--repeats", "1", "--threads", "1"]
    assert main(args + ["--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "kv_pages.json").read_text())
    cells = {(r["tables"], r["pages"], r["round"]) for r in data["runs"]}
    assert cells == {(t, p, r) for t in ("shuffled", "contiguous") for p in ("2 MiB", "4 KiB") for r in (1, 2)}
    assert all(r["ms"] > 0 for r in data["runs"])
    md = (tmp_path / "kv_pages.md").read_text()
    assert "| shuffled |" in md and "| contiguous |" in md and "- command:" in md


def test_too_few_blocks_for_the_sequences_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="--blocks must be at least"):
        main(["--layers", "1", "--blocks", "100", "--out", str(tmp_path)])
