"""The notebook brings along what napari shows: the publication figure, GeoJSON, and what
"significant" means in its summary."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ipywidgets")

from napari_attnreg.core.results.outline import mask_regions
from napari_attnreg.notebook import AttentionExplorer


@pytest.fixture
def explorer(blob_image, tiny_backbone):
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=8, device="cpu", view="image")
    yield ex
    ex.close()


def test_before_run_the_result_is_none_and_exports_say_to_run(explorer, tmp_path):
    assert explorer.result is None
    with pytest.raises(ValueError, match="press Run"):
        explorer.export_figure(tmp_path / "f.png")
    with pytest.raises(ValueError, match="press Run"):
        explorer.export_geojson(tmp_path / "r.geojson")


def test_figure_geojson_and_meaning_after_a_run(explorer, blob_image, tmp_path):
    import imageio.v3 as iio

    explorer.run(wait=True)
    result = explorer.result
    figure = iio.imread(explorer.export_figure(tmp_path / "cells.png"))
    assert figure.shape[0] >= blob_image.shape[0] and figure.shape[1] > blob_image.shape[1]
    path = explorer.export_geojson(tmp_path / "cells")
    collection = json.loads(path.read_text(encoding="utf-8"))
    assert len(collection["features"]) == len(mask_regions(result.significant()))
    assert "Significant =" in explorer.summary_panel.summary.value
    assert "half-patch blocks shuffled" in explorer.summary_panel.summary.value
