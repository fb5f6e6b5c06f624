"""A run's Python warnings reach the analyst in the dock: on the status line and in the
result's diagnostics, with a failed run's error, on every run (napari toasts a warning raised
on its thread once per session and drops a worker's), and not only in the terminal."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")

H, W = 512, 384
QUARTER = "top-left quarter"


@pytest.fixture(scope="module")
def slide(tmp_path_factory):
    """An Aperio SVS of one level, 0.5 µm per pixel: stained tissue on glass."""
    rng = np.random.default_rng(3)
    img = np.full((H, W, 3), 236, np.uint8)
    stain = (rng.random((H, W, 3)) * 90 + np.array([130, 40, 120])).astype(np.uint8)
    img[: H // 2, : W // 2] = stain[: H // 2, : W // 2]
    path = tmp_path_factory.mktemp("warn") / "slide.svs"
    tifffile.imwrite(path, img, tile=(128, 128), photometric="rgb", metadata=None,
                     description=f"Aperio Image Library v10.0.50\n{W}x{H} [0,0 {W}x{H}] "
                                 "(128x128) RAW/RGB|AppMag = 20|MPP = 0.5")
    return path


def _outline(path, x1: float, y1: float):
    ring = [[0, 0], [x1, 0], [x1, y1], [0, y1], [0, 0]]
    path.write_text(json.dumps({"type": "FeatureCollection", "features": [
        {"type": "Feature", "properties": {"objectType": "annotation"},
         "geometry": {"type": "Polygon", "coordinates": [ring]}}]}), encoding="utf-8")
    return str(path)


@pytest.fixture
def slide_widget(viewer_widget, slide):
    viewer, widget = viewer_widget
    [layer] = viewer.open(str(slide), plugin="napari-attnreg")
    widget.options.controls["tiled"].setChecked(True)
    return viewer, widget, layer


def _plain(widget) -> str:
    from qtpy.QtGui import QTextDocument

    doc = QTextDocument()
    doc.setHtml(widget.run_panel.status_label.text())
    return doc.toPlainText()


def test_an_outline_in_the_top_left_quarter_is_warned_of_in_the_dock_on_every_run(
        slide_widget, run_and_wait, tmp_path, notifications):
    """The GeoJSON reader's warning (coordinates of a coarser level?) is on the status line
    and in the result's diagnostics after each run, not a toast napari shows once."""
    viewer, widget, layer = slide_widget
    widget.options.controls["tissue_mask"].setText(_outline(tmp_path / "half.geojson", 190, 250))
    for _ in range(2):  # the same warning again: shown again
        notifications.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing may leave the dock as a Python warning
            outcome = run_and_wait(widget, timeout=120_000)
        assert outcome.ok
        result = widget.current_record().results[()]
        assert result.metadata["n_tissue_tiles"] < result.metadata["n_tiles_total"]
        assert any(QUARTER in d.message and d.severity == "warning"
                   for d in result.diagnostics)
        text = _plain(widget)
        assert "Tissue by file half.geojson" in text  # the outline typed, not the automatic mask
        assert f"⚠ tissue_mask: every polygon of half.geojson lies in the {QUARTER}" in text
        assert any(QUARTER in str(n.message) for n in notifications)  # the warning toast


def test_a_failed_run_shows_the_warning_that_explains_it(slide_widget, run_and_wait, tmp_path):
    """After a run with the automatic mask (named on the status line, with the tiles it left
    out), an outline too small for any tile (a coarse level's pixels): the error, and below
    it the warning that says why; the earlier result and layers stay."""
    viewer, widget, layer = slide_widget
    run_and_wait(widget, timeout=120_000)  # the automatic mask
    before, record = list(viewer.layers), widget.current_record()
    md = record.results[()].metadata
    assert f"Tissue by {md['tissue_mask']}: the {md['n_tiles_total'] - md['n_tissue_tiles']} " \
           "tiles with too little tissue are not measured (transparent)." in _plain(widget)
    widget.options.controls["tissue_mask"].setText(_outline(tmp_path / "tiny.geojson", 12, 12))
    outcome = run_and_wait(widget, timeout=120_000)
    assert not outcome.ok
    text = _plain(widget)
    assert text.index("No tile is at least") < text.index(f"⚠ tissue_mask: every polygon of "
                                                          f"tiny.geojson lies in the {QUARTER}")
    assert list(viewer.layers) == before and widget.current_record() is record


def test_a_user_warning_raised_in_the_worker_joins_the_result(
        viewer_widget, run_and_wait, cells_image, monkeypatch):
    """A UserWarning raised while the job runs (on the worker thread) is among the result's
    diagnostics and on the status line; napari's worker dropped it."""
    from napari_attnreg._napari import widget as widget_module

    real = widget_module.run_job

    def warning_job(job, cancel=None):
        warnings.warn("the reader found something to check", UserWarning, stacklevel=1)
        return (yield from real(job, cancel))

    monkeypatch.setattr(widget_module, "run_job", warning_job)
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    run_and_wait(widget)
    result = widget.current_record().results[()]
    assert [d.message for d in result.diagnostics if d.code == "run_warning"] == [
        "the reader found something to check"]
    assert "⚠ the reader found something to check" in _plain(widget)
