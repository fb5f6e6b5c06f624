"""examples/notebook_quickstart.ipynb runs top to bottom in a real kernel and shows its outputs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook_quickstart.ipynb"


def test_quickstart_notebook_executes(tmp_path):
    # run in a scratch folder: the notebook writes roi_table.csv and attention_result.npz
    path = tmp_path / NOTEBOOK.name
    shutil.copy(NOTEBOOK, path)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on any error

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    widget_views = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(widget_views) == 1, "the explorer must display as a widget"
    assert len(figures) == 2, "histogram and map figures"
    assert "Done in" in text and "B=200" in text
    assert "observed z max" in text and "'label': 2" in text
    assert (tmp_path / "roi_table.csv").read_text().count("\n") == 3  # header + 2 ROIs
    assert (tmp_path / "attention_result.npz").stat().st_size > 0
