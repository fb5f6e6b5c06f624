"""A large ROI table is computed on a worker thread, the latest request winning: threshold
moves during a slide's table no longer freeze napari nor queue stale tables."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytestmark = pytest.mark.gui

SIDE = 1400  # a 100 x 100 token grid; the panel is told it is large


@pytest.fixture
def panel_record(make_napari_viewer, monkeypatch):
    from napari_attnreg._napari import roi_geometry, roi_panel
    from napari_attnreg._napari.geometry import SourceGeometry
    from napari_attnreg._napari.run_record import RunRecord
    from napari_attnreg.core.results.result import AttentionResult
    from napari_attnreg.session import Session

    g = SIDE // 14
    rng = np.random.default_rng(0)
    p = (rng.uniform(size=(g, g)) ** 3).astype(np.float32)
    lfdr = rng.uniform(size=(g, g)).astype(np.float32)
    result = AttentionResult(
        attention=rng.gamma(2.0, size=(g, g)).astype(np.float32),
        maps=dict(z=rng.normal(size=(g, g)).astype(np.float32), p=p, lfdr=lfdr,
                  posterior=1 - lfdr, q=p),
        pi0=0.5, thresholds={"rule": "p", "z_th": 0.0, "p_th": 0.05, "l_th": 0.3},
        image_shape=(SIDE, SIDE), model_shape=(g * 14, g * 14), patch_size=(14, 14))
    session = Session()
    session.add("img", {(): result})
    record = RunRecord(session, "img", "img", SourceGeometry.of_image(result.image_shape))
    monkeypatch.setattr(roi_panel, "BACKGROUND_TABLE_SIZE", 0)
    monkeypatch.setattr(roi_geometry, "LABEL_IMAGE_PIXELS", 0)  # measured as polygons
    viewer = make_napari_viewer()
    shapes = viewer.add_shapes(
        [np.array([[200.0, 300.0], [200.0, 900.0], [800.0, 900.0], [800.0, 300.0]]),
         np.array([[1000.0, 1000.0], [150.0, 200.0]])],
        shape_type=["rectangle", "ellipse"], name="rois")
    panel = roi_panel.RoiPanel(viewer, lambda: record)  # no layer chosen: the tests do
    assert panel.current_layer() is None
    return panel, record, session, shapes


def _gated(monkeypatch):
    """planes_roi_rows that records its threads and waits for ``gate`` on its first call."""
    from napari_attnreg._napari import roi_panel

    compute, calls, gate = roi_panel.planes_roi_rows, [], threading.Event()

    def gated(planes, cache=None):
        calls.append((threading.current_thread(), planes[0].result.thresholds["p_th"]))
        if len(calls) == 1:
            assert gate.wait(20)
        return compute(planes, cache)

    monkeypatch.setattr(roi_panel, "planes_roi_rows", gated)
    return calls, gate


def test_threshold_moves_during_a_table_keep_only_the_latest(panel_record, monkeypatch,
                                                             qtbot):
    from napari_attnreg._napari.roi_geometry import record_roi_rows
    from napari_attnreg._napari.roi_panel import UPDATING

    panel, record, session, shapes = panel_record
    calls, gate = _gated(monkeypatch)
    shown = []
    panel.rows_changed.connect(shown.append)
    panel.set_layer(shapes)  # the first table starts on a worker and waits
    assert panel.status.text() == UPDATING and not panel.table.isEnabled()
    assert not panel.export_button.isEnabled()
    assert panel.updating
    for p_th in (0.02, 0.01):  # two quick moves while it computes
        session.set_thresholds({"p_th": p_th}, "img")
        panel.update_table()
        assert panel.status.text() == UPDATING
    gate.set()
    qtbot.waitUntil(lambda: panel.worker is None and bool(panel.rows), timeout=20_000)
    # the table of 0.02 was never computed, the one of 0.05 never shown
    assert [p for _, p in calls] == [0.05, 0.01]
    assert all(thread is not threading.main_thread() for thread, _ in calls)
    assert len(shown) == 1
    want = record_roi_rows(record, shapes)
    assert [r["n_tokens"] for r in panel.rows] == [r["n_tokens"] for r in want]
    assert [r["frac_significant"] for r in panel.rows] == [r["frac_significant"] for r in want]
    assert panel.table.isEnabled() and panel.table.rowCount() == 2
    assert "2 ROI row(s)" in panel.status.text()
    assert panel.export_button.isEnabled() and not panel.updating


@pytest.mark.parametrize(("error", "shown"), [
    (ValueError("These ROIs span too many pixels; draw smaller regions."),
     "These ROIs span too many pixels; draw smaller regions."),
    (MemoryError(), "ROI table not computed"),
])
def test_an_error_of_the_worker_is_shown(panel_record, monkeypatch, qtbot, error, shown):
    from napari_attnreg._napari import roi_panel

    panel, _, _, shapes = panel_record

    def fails(planes, cache=None):
        raise error

    monkeypatch.setattr(roi_panel, "planes_roi_rows", fails)
    panel.set_layer(shapes)
    qtbot.waitUntil(lambda: panel.worker is None and shown in panel.status.text(),
                    timeout=20_000)
    assert panel.rows == [] and panel.table.rowCount() == 0 and panel.table.isEnabled()


def test_a_small_table_stays_synchronous(panel_record, monkeypatch):
    from napari_attnreg._napari import roi_panel

    panel, _, _, shapes = panel_record
    monkeypatch.setattr(roi_panel, "BACKGROUND_TABLE_SIZE", (SIDE // 14) ** 2)
    panel.set_layer(shapes)
    assert panel.worker is None and len(panel.rows) == 2


def test_a_threshold_move_does_not_read_the_shapes_again(panel_record, monkeypatch):
    """napari triangulates every shape of the copy the polygons are read from: 0.5 s for four
    400-vertex regions, on the GUI thread at every move, before the table was kept off it."""
    from napari_attnreg._napari import roi_geometry, roi_panel

    panel, _, session, shapes = panel_record
    monkeypatch.setattr(roi_panel, "BACKGROUND_TABLE_SIZE", (SIDE // 14) ** 2)
    calls = []
    read = roi_geometry.shapes_roi_polygons
    monkeypatch.setattr(roi_geometry, "shapes_roi_polygons",
                        lambda *a: calls.append(1) or read(*a))
    panel.set_layer(shapes)
    session.set_thresholds({"p_th": 0.01}, "img")
    panel.update_table()
    assert len(calls) == 1 and len(panel.rows) == 2
    shapes.add_rectangles(np.array([[1100.0, 100.0], [1300.0, 300.0]]))
    panel.update_table()
    assert len(calls) == 2 and len(panel.rows) == 3
    shapes.translate = (0.0, 14.0)  # the same data placed elsewhere
    panel.update_table()
    assert len(calls) == 3


def test_saving_while_the_table_updates_is_refused_not_written_stale(qtbot, monkeypatch):
    """The saved ROI table would be the previous thresholds' rows while a new one computes."""
    from types import SimpleNamespace

    import napari.utils.notifications as notifications

    from napari_attnreg._napari import results_io

    errors, saved = [], []
    monkeypatch.setattr(notifications, "show_error", errors.append)
    monkeypatch.setattr(results_io, "save_through_dialog", lambda *a, **k: saved.append(a))
    panel = SimpleNamespace(updating=True, rows=[{"label": 1}])
    record = SimpleNamespace(source_name="img")
    widget = SimpleNamespace(current_record=lambda: record, roi_panel=panel, viewer=None)
    button = results_io.SaveButton(widget)
    qtbot.addWidget(button)
    button._on_clicked()
    assert saved == [] and "being updated" in errors[0]
    panel.updating = False
    button._on_clicked()
    assert len(saved) == 1 and len(errors) == 1
