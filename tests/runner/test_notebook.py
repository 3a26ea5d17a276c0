"""notebooks/analysis.ipynb runs top to bottom on the committed results set, and is stored without outputs."""

import os
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "analysis.ipynb"
SAMPLE = ROOT / "results" / "notebook_sample"

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "run nbstripout notebooks/*.ipynb"


def test_committed_results_are_complete():
    sweep = pd.read_csv(SAMPLE / "sweep.csv")
    assert len(sweep) >= 4 and sweep["scheduler.name"].nunique() >= 2 and sweep["trace.time_scale"].nunique() >= 2
    for run in sweep["run_dir"].astype(str):
        for name in ("summary.json", "requests.parquet", "steps.parquet", "config.yaml"):
            assert (SAMPLE / run / name).exists(), (run, name)


def test_notebook_executes(tmp_path, monkeypatch):
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend makes the images
    monkeypatch.delenv("TESTBED_RESULTS", raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()
    nbformat.write(nb, tmp_path / "executed.ipynb")  # never back into the repo
    images = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
    ]
    assert len(images) >= 3  # TTFT CDFs, throughput vs rate, KV over time
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert os.path.exists(tmp_path / "executed.ipynb")
