"""examples/notebook_quickstart.ipynb: committed with its outputs, runs top to bottom in a real
kernel, and writes its files to a temporary folder, never the working directory.

The outputs were stored by executing the notebook with nbclient (``store_widget_state=False``
so that no widget state is saved) in a scratch working directory.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook_quickstart.ipynb"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _outputs(nb) -> list:
    return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]


def _stream_text(nb) -> str:
    return "".join(o.get("text", "") for o in _outputs(nb) if o.output_type == "stream")


def test_committed_notebook_shows_its_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.outputs and cell.execution_count for cell in code), "run it before committing"
    outputs = _outputs(nb)
    assert not [o for o in outputs if o.output_type == "error"]
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 3  # the widget's view as a picture, the histograms, the maps
    assert "Done in" in _stream_text(nb) and "B=200" in _stream_text(nb)
    # small enough to review and diff: no saved widget state, modest images
    assert "widgets" not in nb.metadata
    assert NOTEBOOK.stat().st_size < 600_000


def test_quickstart_notebook_executes_and_writes_to_a_temporary_folder(tmp_path):
    path = tmp_path / NOTEBOOK.name
    shutil.copy(NOTEBOOK, path)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     store_widget_state=False,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on any error

    outputs = _outputs(nb)
    assert not [o for o in outputs if o.output_type == "error"]
    assert len([o for o in outputs if WIDGET_VIEW in o.get("data", {})]) == 1
    assert len([o for o in outputs if "image/png" in o.get("data", {})]) == 3
    text = _stream_text(nb)
    assert "Done in" in text and "B=200" in text
    assert "map-level p = " in text and "ForwardStop at α = 0.1" in text and "'label': 2" in text
    # nothing was written to the working directory (the kernel ran in tmp_path) ...
    assert sorted(p.name for p in tmp_path.iterdir()) == [NOTEBOOK.name]
    # ... the files went to the temporary folder the notebook made
    csv_path = Path(re.search(r"^(\S+roi_table\.csv)$", text, re.M).group(1))
    npz_path = Path(re.search(r"^(\S+attention_result\.npz)$", text, re.M).group(1))
    try:
        assert csv_path.parent == npz_path.parent
        assert csv_path.parent.name.startswith("attnreg-quickstart-")
        assert tmp_path not in csv_path.parents
        lines = csv_path.read_text().splitlines()
        assert len(lines) == 3 and "source_image" in lines[0]  # header + 2 ROIs, provenance
        assert npz_path.stat().st_size > 0
    finally:
        shutil.rmtree(csv_path.parent, ignore_errors=True)
