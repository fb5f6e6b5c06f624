"""The napari ROI table on a slide analysed at full resolution: Shapes are measured as
polygons (no label image of the whole result), with the label path's rows where both apply."""

from __future__ import annotations

import math
import resource
import tracemalloc
from contextlib import contextmanager

import numpy as np
import pytest

pytest.importorskip("napari")

from napari.components import ViewerModel
from napari.layers import Labels, Shapes

from napari_attnreg._napari import roi_geometry
from napari_attnreg._napari.geometry import SourceGeometry
from napari_attnreg._napari.run_record import RunRecord
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.stats.roi import NO_PIXELS
from napari_attnreg.session import Session

SLIDE = (50_000, 50_000)  # a level-0 whole slide: its label image would be 2.5 G pixels


def make_record(grid=(7, 9), image_shape=(61, 83), seed=0) -> RunRecord:
    rng = np.random.default_rng(seed)
    p = rng.uniform(size=grid) ** 3
    lfdr = rng.uniform(size=grid)
    result = AttentionResult(
        attention=rng.gamma(2.0, size=grid),
        maps=dict(z=rng.normal(size=grid), p=p, lfdr=lfdr, posterior=1 - lfdr, q=p),
        pi0=0.5, thresholds={"rule": "p", "z_th": 0.0, "p_th": 0.2, "l_th": 0.3},
        image_shape=image_shape, model_shape=(grid[0] * 4, grid[1] * 4), patch_size=(4, 4))
    session = Session()
    session.add("img", {(): result})
    return RunRecord(session, "img", "img", SourceGeometry.of_image(image_shape))


@contextmanager
def memory_capped(extra: int = 2 * 2**30):
    """Address space limited to what the process holds plus ``extra``: a silent allocation
    of a whole slide's label image fails (MemoryError) instead of taking the machine."""
    with open("/proc/self/statm") as handle:
        held = int(handle.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (held + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def same_rows(got, want):
    assert [r["label"] for r in got] == [r["label"] for r in want]
    for g, w in zip(got, want):
        for key, value in w.items():
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(g[key]), key
            else:
                assert g[key] == value, (w["label"], key, g[key], value)


def test_shapes_as_polygons_give_the_label_image_rows(monkeypatch):
    record = make_record()
    layer = Shapes(
        [np.array([[3, 4], [3, 30], [20, 30], [20, 4]]),  # rectangle
         np.array([[30.2, 10.7], [55.9, 14.1], [41.3, 25.0], [58.6, 39.4], [27.7, 33.3]]),
         np.array([[35, 60], [12, 15]]),  # ellipse: centre, radii
         np.array([[10.5, 20.5], [10.5, 50.5], [25.5, 50.5], [25.5, 20.5]]),  # over shape 1
         np.array([[-9.0, 70.2], [-4.0, 95.0], [70.0, 91.5], [48.3, 66.0]]),  # past the edge
         np.array([[50.2, 2.3], [50.2, 4.8], [52.9, 4.8], [52.9, 2.3]])],  # < a token
        shape_type=["rectangle", "polygon", "ellipse", "rectangle", "polygon", "polygon"])
    want = roi_geometry.record_roi_rows(record, layer)  # a small image: the label image
    assert len(want) == 6
    monkeypatch.setattr(roi_geometry, "LABEL_IMAGE_PIXELS", 0)
    same_rows(roi_geometry.record_roi_rows(record, layer), want)


def test_a_whole_slide_result_is_measured_without_a_label_image():
    # a level-0 run (tokens of 500 px keep its maps small): the table allocated a 20 GB
    # label image of the slide, and napari's to_labels another, before any row came
    record = make_record(grid=(100, 100), image_shape=SLIDE)
    layer = Shapes([np.array([[1199.5, 2999.5], [1199.5, 4999.5], [3999.5, 4999.5],
                              [3999.5, 2999.5]]),
                    np.array([[20_000.3, 20_000.7], [23_000.1, 21_500.2], [21_000.9, 24_000.4]]),
                    np.array([[30_000.1, 30_000.1], [30_000.1, 30_000.4],
                              [30_000.4, 30_000.4]])],  # between pixel centres
                   shape_type=["rectangle", "polygon", "polygon"])
    tracemalloc.start()
    with memory_capped():
        rows = roi_geometry.record_roi_rows(record, layer)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 2**20, peak
    assert [r["label"] for r in rows] == [1, 2, 3]
    assert rows[0]["area_px"] == 2800 * 2000 and rows[0]["n_tokens"] == 24
    assert 0 < rows[1]["area_px"] < 3000 * 4000 / 2
    assert rows[2]["area_px"] == 0 and rows[2]["enrichment_test_note"] == NO_PIXELS


def test_a_labels_layer_on_a_large_image_is_still_measured(monkeypatch):
    # 4096² < 5000²: shapes go as polygons there, a Labels layer keeps its label image
    record = make_record(grid=(10, 10), image_shape=(5000, 5000))
    data = np.zeros((50, 50), dtype=np.uint8)
    data[5:20, 10:30] = 3
    layer = Labels(data, scale=(100, 100), translate=(49.5, 49.5), name="painted")
    (row,) = roi_geometry.record_roi_rows(record, layer)
    assert row["label"] == 3 and row["area_px"] == 1500 * 2000


def test_a_labels_layer_on_a_whole_slide_result_says_what_to_do():
    record = make_record(grid=(100, 100), image_shape=SLIDE)
    layer = Labels(np.zeros((100, 100), dtype=np.uint8), scale=(500, 500), name="painted")
    with memory_capped(), pytest.raises(ValueError, match="Shapes layer"):
        roi_geometry.record_roi_rows(record, layer)


def test_a_line_on_a_whole_slide_result_is_refused():
    record = make_record(grid=(100, 100), image_shape=SLIDE)
    layer = Shapes([np.array([[10.0, 10.0], [4000.0, 9000.0]])], shape_type=["line"])
    with memory_capped(), pytest.raises(ValueError, match="no area"):
        roi_geometry.record_roi_rows(record, layer)


def test_a_threshold_move_reuses_the_regions_tokens(monkeypatch, qtbot):
    from napari_attnreg._napari.roi_panel import RoiPanel

    calls = []
    rasterize = roi_geometry.polygon_tokens
    monkeypatch.setattr(roi_geometry, "polygon_tokens",
                        lambda *a, **k: calls.append(1) or rasterize(*a, **k))
    record = make_record(grid=(100, 100), image_shape=SLIDE)
    viewer = ViewerModel()
    panel = RoiPanel(viewer, lambda: record)
    qtbot.addWidget(panel)
    layer = viewer.add_shapes([np.array([[1000.0, 1000.0], [1000.0, 9000.0], [7000.0, 9000.0],
                                         [7000.0, 1000.0]])], shape_type=["rectangle"])
    panel.set_layer(layer)
    assert len(panel.rows) == 1 and len(calls) == 1
    first = panel.rows[0]["frac_significant"]
    record.session.set_thresholds({"p_th": 0.01}, "img")
    panel.update_table()
    assert len(calls) == 1 and panel.rows[0]["frac_significant"] < first
    layer.add_rectangles(np.array([[20_000.0, 20_000.0], [26_000.0, 28_000.0]]))
    panel.update_table()
    assert len(calls) == 2 and len(panel.rows) == 2
