"""A plain tiled TIFF above the untiled budget, run tiled from napari's dock and with
``regularize(path, tiled=True)`` (what ``attnreg run FILE --tiled`` and a batch call): the
same slide of one level, the same tissue mask, the same p-values. Before, the dock ran it as
a slide (tissue mask) and the path-based front ends as a plain image (none)."""

from __future__ import annotations

import numpy as np
import pytest

tifffile = pytest.importorskip("tifffile")
pytest.importorskip("tiffslide")
pytest.importorskip("zarr")

pytestmark = pytest.mark.gui

H, W = 512, 448
BUDGET = 128 * 128  # the untiled pixel budget here: the file is above it


def _pixels() -> np.ndarray:
    """Glass with a stained ellipse in its top-left corner."""
    rng = np.random.default_rng(11)
    img = np.full((H, W, 3), 236, np.uint8)
    yy, xx = np.mgrid[0:H, 0:W]
    tissue = (yy - 110) ** 2 / 100 ** 2 + (xx - 100) ** 2 / 90 ** 2 < 1
    stain = rng.random((H, W, 3)) * 90 + np.array([130, 40, 120])
    img[tissue] = stain[tissue].clip(0, 255).astype(np.uint8)
    return img


def test_the_dock_and_a_path_run_read_a_large_tiled_tiff_alike(
        tmp_path, monkeypatch, viewer_widget, run_and_wait, tiny_backbone):
    from napari_attnreg import regularize
    from napari_attnreg._napari import slide_pyramid
    from napari_attnreg.core.run import lazy

    monkeypatch.setattr(lazy, "MAX_UNTILED_PIXELS", BUDGET)
    monkeypatch.setattr(slide_pyramid, "COARSEST_SIDE", 64)
    path = tmp_path / "export.tif"
    tifffile.imwrite(path, _pixels(), tile=(128, 128), photometric="rgb")
    viewer, widget = viewer_widget
    [layer] = viewer.open(str(path), plugin="napari-attnreg")
    assert layer.metadata["slide"]["levels"] == 1
    widget.options.controls["tiled"].setChecked(True)
    widget.source.set_layer(layer)
    run_and_wait(widget, timeout=120_000)
    dock = widget.current_record().results[()]
    direct = regularize(path, tiny_backbone, tiled=True, n_boot=16, chunk_size=8,
                        device="cpu", seed=0)
    for result in (dock, direct):
        md = result.metadata
        assert md["tissue_mask"].startswith("auto") and md["slide_level"] == 0
        assert 0 < md["n_tissue_tiles"] < md["n_tiles_total"]
    assert dock.image_shape == direct.image_shape == (H, W)
    np.testing.assert_array_equal(dock.null_summary["tissue_mask"],
                                  direct.null_summary["tissue_mask"])
    np.testing.assert_array_equal(dock.p, direct.p)
    np.testing.assert_array_equal(dock.attention, direct.attention)
