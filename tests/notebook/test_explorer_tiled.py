"""Tiled runs from the notebook explorer: controls, native token grid on the image, cancel."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("ipywidgets")

from napari_attnreg.core.run.engine import RunConfig
from napari_attnreg.core.run.options import option
from napari_attnreg.core.run.tiling import work_shape
from napari_attnreg.notebook import AttentionExplorer

PATCH = (8, 8)  # the bundled demo model: patch 8, 128 px input


def _field(shape: tuple[int, int]) -> np.ndarray:
    """A large uint16 field of bright blobs on noise."""
    rng = np.random.default_rng(2)
    yy, xx = np.mgrid[0:shape[0], 0:shape[1]]
    img = 300 + 40 * rng.standard_normal(shape)
    for cy, cx in rng.uniform(0, 1, (12, 2)) * np.asarray(shape):
        img += 2500 * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 80)
    return np.clip(img, 0, 65535).astype(np.uint16)


def test_tiling_controls_default_to_the_core_and_follow_the_checkbox():
    ex = AttentionExplorer(_field((64, 48)), "demo", n_boot=4, device="cpu", view="image")
    defaults = RunConfig()
    c = ex.controls
    assert c["tiled"].description == option("tiled").label  # the core's option metadata
    assert c["tiled"].tooltip == option("tiled").help
    assert (ex.tiled, ex.tile_overlap, ex.tile_scale) == (
        defaults.tiled, defaults.tile_overlap, defaults.tile_scale)
    scale = option("tile_scale")
    assert (c["tile_scale"].min, c["tile_scale"].max) == (scale.minimum, scale.maximum)
    # empty = a quarter of the tile (the core's default); a number overrides it
    assert c["tile_overlap"].value == "" and c["tile_overlap"].placeholder == "auto"
    assert c["tile_overlap"].disabled and c["tile_scale"].disabled
    c["tiled"].value = True
    assert ex.tiled and not c["tile_overlap"].disabled and not c["tile_scale"].disabled
    c["tile_overlap"].value = "16"
    ex.tile_scale = 2.0  # state set in code moves the control
    assert ex.tile_overlap == 16 and c["tile_scale"].value == 2.0
    with pytest.raises(Exception, match="tile_scale must be a finite number in"):
        ex.tile_scale = 0.0
    ex.close()
    # the options can be given to the constructor too, as before (RunConfig field names)
    ex = AttentionExplorer(_field((64, 48)), "demo", tiled=True, tile_overlap=8, view="image")
    assert ex.tiled and ex.tile_overlap == 8 and not ex.controls["tile_overlap"].disabled
    ex.close()


def test_overlap_that_is_not_whole_patches_is_explained():
    ex = AttentionExplorer(_field((300, 200)), "demo", n_boot=4, device="cpu", view="image",
                           tiled=True, tile_overlap=5)
    assert ex.run(wait=True) is None
    assert "multiple of the patch size" in ex.status and ex.result is None
    ex.close()


@pytest.mark.parametrize(("shape", "overlap", "scale"), [
    ((600, 400), 0, 1.0),
    ((1000, 700), 0, 1.0),  # 700 px is not whole patches: tokens are 8 x 7.95 image pixels
    ((1000, 700), 16, 2.0),
])
def test_tiled_run_gives_native_grid_on_the_image(shape, overlap, scale):
    ex = AttentionExplorer(_field(shape), "demo", n_boot=8, device="cpu", view="image")
    ex.controls["tiled"].value = True
    ex.controls["tile_overlap"].value = str(overlap)  # a text box: empty = a quarter tile
    ex.controls["tile_scale"].value = scale
    result = ex.run(wait=True)
    assert result is not None, ex.status
    md = result.metadata
    assert md["tiled"] is True and md["null_scope"] == "image"
    assert (md["tile_overlap"], md["tile_scale"]) == (overlap, scale)
    work = work_shape(shape, PATCH, scale)
    assert result.grid_shape == (work[0] // PATCH[0], work[1] // PATCH[1])
    if scale == 1.0 and shape == (600, 400):
        assert result.grid_shape == (75, 50)
    assert md["forward_passes"] == md["n_tiles"] + 8
    assert result.image_shape == shape
    # the overlay lies on the whole image: each shown pixel carries the token over it
    gh, gw = result.grid_shape
    ids = np.arange(gh * gw).reshape(gh, gw)
    np.testing.assert_array_equal(ex.canvas.token_index,
                                  ex.image_panel.grid.sample(result.to_pixels(ids)))
    assert ex.canvas.token_index[0, 0] == 0 and ex.canvas.token_index[-1, -1] == gh * gw - 1
    assert ex.canvas.token_index[0, -1] == gw - 1 and ex.canvas.token_index[-1, 0] == (gh - 1) * gw
    assert ex.rendered.shape[:2] == ex.image_panel.grid.shape
    assert ex.status.startswith("Done in") and f"{md['n_tiles']} tiles" in ex.status
    assert "tiled" in ex.summary_panel.diagnostics.value
    ex.close()


def test_cancel_stops_a_tiled_background_run():
    ex = AttentionExplorer(_field((600, 400)), "demo", n_boot=2000, chunk_size=2, device="cpu",
                           view="image", tiled=True)
    seen: list[tuple[float, str]] = []

    async def scenario():
        assert ex.run() is None  # returns at once: the run continues on the loop
        assert ex.running and not ex.buttons["cancel"].disabled
        assert ex.controls["tiled"].disabled and ex.controls["tile_overlap"].disabled
        while ex.running and not any("null images" in label for _, label in seen):
            await asyncio.sleep(0.01)
            if ex.run_panel.progress.value > 0:
                seen.append((ex.run_panel.progress.value, ex.status))
        ex.buttons["cancel"].click()
        return await ex.wait()

    result = asyncio.run(scenario())
    assert result is None and not ex.running
    assert ex.status.startswith("Cancelled")
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] < 0.5
    assert any("tiles" in label for _, label in seen)  # progress through the tiles first
    assert ex.run_panel.progress.bar_style == "warning" and not ex.controls["tiled"].disabled
    ex.close()
