"""notebooks/kv_reuse.ipynb runs top to bottom on the committed sample, and is stored without outputs."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "kv_reuse.ipynb"
SAMPLE = ROOT / "results" / "kv_reuse" / "sample"

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


def test_committed_sample_is_complete_and_consistent():
    import json

    for run in ("device", "host_tier"):
        for name in ("summary.json", "requests.parquet", "turns.parquet", "kv_accesses.parquet"):
            assert (SAMPLE / run / name).exists(), (run, name)
    device = json.loads((SAMPLE / "device" / "summary.json").read_text())
    whatif = json.loads((SAMPLE / "device" / "whatif.json").read_text())
    assert whatif["lru_hit_rate_at_run_capacity"] == pytest.approx(device["prefix_hit_rate"])


def test_notebook_is_stored_without_outputs_and_executes(tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert all(c.outputs == [] for c in nb.cells if c.cell_type == "code"), "run nbstripout notebooks/*.ipynb"
    monkeypatch.delenv("MPLBACKEND", raising=False)
    monkeypatch.delenv("TESTBED_KV_RESULTS", raising=False)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 3
