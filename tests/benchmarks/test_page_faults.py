"""benchmarks.page_faults: both modes run in their own processes and the results land where it says (its
main in this process: the parent's own process only adds a start-up)."""

import json

from benchmarks.page_faults import main


def test_page_faults_writes_both_modes(tmp_path):
    args = ["--model", "tiny", "--parallel", "2"]
    args += ["--prompt-len", "24", "--output-len", "3", "--threads", "1", "--repeats", "2", "--out", str(tmp_path)]
    args += ["--kv-cache-memory-gb", "0.0625"]  # each of the 4 engines zeroes its KV budget (default 1 GiB)
    assert main(args) == 0
    result = json.loads((tmp_path / "page_faults.json").read_text())
    # interleaved: kept first in round 1, default first in round 2
    assert [(r["mode"], r["run"]) for r in result["runs"]] == [("kept", 1), ("default", 1), ("default", 2), ("kept", 2)]
    assert all(r["seconds"] > 0 and r["minor_faults"] >= 0 for r in result["runs"])
    assert "| default |" in (tmp_path / "page_faults.md").read_text()
