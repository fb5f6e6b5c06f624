"""A DICOM whole-slide image of one level above the untiled budget: napari's reader gives a
lazy pyramid over it (the file's level, then halved levels for display), and a run has the
file's level only."""

from __future__ import annotations

import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom", minversion="3.0")
pytest.importorskip("tiffslide")

from test_dicom_wsi import H, W, _pixels, write_level  # noqa: E402

from napari_attnreg._napari.slide_pyramid import BlockMeanLevel  # noqa: E402


def test_a_single_level_dicom_slide_above_the_budget_opens_as_a_lazy_pyramid(tmp_path,
                                                                              monkeypatch):
    from napari_attnreg._napari import slide_pyramid
    from napari_attnreg._napari.io import read_dicom_wsi_layers
    from napari_attnreg.core.run import lazy

    monkeypatch.setattr(lazy, "MAX_UNTILED_PIXELS", 256 * 256)
    monkeypatch.setattr(slide_pyramid, "COARSEST_SIDE", 256)
    folder = tmp_path / "one_level"
    folder.mkdir()
    write_level(folder / "level0.dcm", _pixels(), 0.00025)
    [(data, kwargs, kind)] = read_dicom_wsi_layers(str(folder))
    assert kind == "image" and kwargs["multiscale"] and kwargs["rgb"]
    assert [level.shape for level in data] == [(H, W, 3), (H // 2, W // 2, 3),
                                               (H // 4, W // 4, 3)]
    assert not isinstance(data[0], BlockMeanLevel)
    assert [level.blocks_held for level in data[1:]] == [0, 0]  # nothing read at open
    slide = kwargs["metadata"]["slide"]
    assert slide["levels"] == 1 and slide["display_levels"] == 3 and slide["run_level"] == 0
    np.testing.assert_array_equal(data[1][:4, :5],
                                  _pixels()[:8, :10].reshape(4, 2, 5, 2, 3).mean((1, 3))
                                  .round().astype(np.uint8))
