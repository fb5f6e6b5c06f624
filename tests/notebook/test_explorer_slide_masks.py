"""A slide in the explorer as a pathologist uses it in JupyterLab (round 12's session): QuPath
outlines as the tissue mask, bad outlines, the glass left out, and the region tools on a slide.
Each test here failed before the fix it names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")

from napari_attnreg.notebook import AttentionExplorer  # noqa: E402

SIZE = 1024
FAST = {"n_boot": 4, "device": "cpu", "view": "image", "tiled": True, "level": 1}


def _aperio(w: int, h: int) -> str:
    return (f"Aperio Image Library v10.0.50\n{w}x{h} [0,0 {w}x{h}] (256x256) RAW/RGB"
            "|AppMag = 40|MPP = 0.25")


@pytest.fixture(scope="module")
def slide(tmp_path_factory) -> Path:
    """An Aperio SVS of 1024² at 0.25 µm (levels 1/2, 1/4): stained tissue top left, glass."""
    rng = np.random.default_rng(0)
    img = np.full((SIZE, SIZE, 3), 236, np.uint8)
    stain = rng.random((600, 600, 3)) * 90 + np.array([130, 40, 120])
    img[:600, :600] = stain.clip(0, 255).astype(np.uint8)
    path = tmp_path_factory.mktemp("slides") / "slide.svs"
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), description=_aperio(SIZE, SIZE), photometric="rgb",
                  metadata=None)
        tif.write(img[::16, ::16].copy(), description="Aperio Image Library v10.0.50\nthumb",
                  photometric="rgb", metadata=None)
        for k in (2, 4):
            tif.write(img[::k, ::k].copy(), tile=(128, 128),
                      description=_aperio(SIZE // k, SIZE // k), photometric="rgb",
                      metadata=None)
    return path


def _outline(path: Path, geometry: dict) -> str:
    path.write_text(json.dumps({"type": "Feature", "geometry": geometry,
                                "properties": {"objectType": "annotation"}}))
    return str(path)


def _type_mask(explorer: AttentionExplorer, text: str) -> None:
    """Type into the Advanced panel's Tissue mask box, as a user does."""
    explorer.options_panel.advanced.controls["tissue_mask"].value = text


# QuPath-looking files whose geometry the GeoJSON reader lets through as Python's or shapely's
# own error (a TypeError, a KeyError, shapely's GeometryTypeError)
MALFORMED = {
    "flat": {"type": "Polygon", "coordinates": [100, 200]},
    "missing": {"type": "Polygon"},
    "too deep": {"type": "Polygon", "coordinates": [[[[0, 0], [9, 0], [9, 9], [0, 0]]]]},
    "unknown type": {"type": "Blob", "coordinates": [[0, 0]]},
}


def test_a_malformed_outline_says_so_in_the_status_and_keeps_the_result(slide, tmp_path):
    # before: Run raised the reader's TypeError/KeyError into the button's handler, which
    # JupyterLab only logs; the status line went on showing the previous message, here
    # another file's error, and the user had no word on the file in the box
    ring = [[0, 0], [600, 0], [600, 600], [0, 600], [0, 0]]
    good = _outline(tmp_path / "tissue.geojson", {"type": "Polygon", "coordinates": [ring]})
    ex = AttentionExplorer(str(slide), "demo", **FAST)
    _type_mask(ex, good)
    first = ex.run(wait=True)
    assert first is not None, ex.status
    kept = ex.session.latest
    outside = _outline(tmp_path / "outside.geojson", {"type": "Polygon", "coordinates": [
        [[x + 5000, y + 5000] for x, y in ring]]})
    _type_mask(ex, outside)
    ex.buttons["run"].click()
    assert "outside.geojson" in ex.status and "lie outside" in ex.status, ex.status
    for i, (what, geometry) in enumerate(MALFORMED.items()):
        name = f"bad{i}.geojson"
        _type_mask(ex, _outline(tmp_path / name, geometry))
        ex.buttons["run"].click()  # what the browser's click does: must not raise
        assert name in ex.status and "malformed GeoJSON geometry" in ex.status, (what, ex.status)
        assert "previous result is kept" in ex.status
        assert isinstance(ex.last_error, ValueError)
        assert ex.session.latest is kept and not ex.run_panel.busy
    ex.close()


def test_the_region_tools_on_a_slide_say_why_they_are_off(slide):
    from napari_attnreg.notebook.explorer import NO_DRAWING
    from napari_attnreg.notebook.roi_panel import DRAW_TOOLTIPS, NO_ROIS, NO_SLIDE_ROIS

    # each draw button keeps its own tooltip ("Drag a rectangle"), which the browser shows
    # instead of the group's, so a disabled button must carry why on every button. A slide
    # takes regions (shapes on its picture): only a view that cannot draw turns them off
    ex = AttentionExplorer(str(slide), "demo", **FAST)
    panel = ex.roi_panel
    assert panel.draw.disabled and list(panel.draw.tooltips) == [NO_DRAWING] * 3
    assert not panel.clear.disabled and not panel.export.disabled
    assert NO_SLIDE_ROIS in html_text(panel.table.value) and "roi=mask" not in panel.table.value
    with pytest.raises(ValueError, match="run the analysis"):
        ex.export_roi_csv("rois.csv")
    # an image in memory: the table invites a mask again
    ex.set_image(np.random.default_rng(0).random((64, 64)))
    assert not panel.clear.disabled and not panel.export.disabled
    assert panel.draw.disabled and list(panel.draw.tooltips) == [NO_DRAWING] * 3
    assert NO_ROIS in html_text(panel.table.value)
    ex.close()
    # a view that draws: every button its own tooltip, enabled, on a slide too
    pytest.importorskip("ipympl")
    for image in (np.random.default_rng(0).random((64, 64)), str(slide)):
        ex = AttentionExplorer(image, "demo", view="ipympl")
        assert not ex.roi_panel.draw.disabled
        assert list(ex.roi_panel.draw.tooltips) == list(DRAW_TOOLTIPS)
        ex.close()


def html_text(value: str) -> str:
    import html

    return html.unescape(value)


def test_every_advanced_control_fits_the_section(slide):
    # seen in JupyterLab: the Advanced section's content box is 338 px wide and its controls
    # 360 px plus 2 px margins (so 100 % is still 4 px too wide), so each was cut at the
    # right edge and the section scrolled sideways when a value was typed (the Tissue mask
    # box), cutting the labels' first letters
    from napari_attnreg.notebook.advanced_panel import FIT_WIDTH, AdvancedPanel

    ex = AttentionExplorer(str(slide), "demo", **FAST)
    advanced = ex.options_panel.advanced
    section_px = int(advanced.layout.width.removesuffix("px"))
    rows = advanced.children[0].children
    assert ex.concept_panel in rows and advanced.controls["tissue_mask"] in rows
    for row in rows:
        width = row.layout.width
        fits = row.layout.max_width == FIT_WIDTH or (
            width is not None and width.endswith("px") and int(width[:-2]) <= section_px - 40)
        assert fits, (getattr(row, "description", row), width, row.layout.max_width)
    ex.close()
    assert isinstance(advanced, AdvancedPanel)


def _tissue_pixels(explorer: AttentionExplorer) -> np.ndarray:
    from napari_attnreg.notebook.render import TISSUE_COLOR

    return np.all(explorer.rendered == np.array(TISSUE_COLOR, np.uint8), axis=-1)


def test_the_tissue_mask_is_drawn_and_named_in_the_legend(slide, tmp_path):
    # before: with the default overlay (regularized: transparent wherever nothing is
    # significant) a masked slide run looked exactly like the slide alone, and nothing on
    # screen said which part had been tested or that the glass was not measured
    ex = AttentionExplorer(str(slide), "demo", **FAST)
    assert ex.run(wait=True) is not None, ex.status
    assert ex.rendered.shape[:2] == (768, 768)  # 1024² shown at 0.75
    edge = _tissue_pixels(ex)
    # the automatic mask's edge runs along the tissue block (600 px of 1024: display 450)
    assert edge[:400, 440:460].any(axis=1).mean() > 0.9
    assert not edge[0, :430].any() and not edge[:400, 0].any()  # the slide's border is none
    assert not edge[500:, 500:].any() and not edge[100:350, 100:350].any()
    legend = ex.display_panel.legend.value
    md = ex.result.metadata
    assert "edge of the tissue mask (auto" in legend
    assert f"{md['n_tissue_tiles']} of {md['n_tiles_total']} tiles tested" in legend
    assert "not measured" in legend
    # a QuPath outline: its own edge, with a hole, at the slide's full-resolution pixels
    ring = [[0, 0], [400, 0], [400, 400], [0, 400], [0, 0]]
    hole = [[100, 100], [100, 200], [200, 200], [200, 100], [100, 100]]
    _type_mask(ex, _outline(tmp_path / "qupath.geojson",
                            {"type": "Polygon", "coordinates": [ring, hole]}))
    assert ex.run(wait=True) is not None, ex.status
    edge = _tissue_pixels(ex)
    assert edge[:280, 295:305].any(axis=1).mean() > 0.9  # x = 400 → display 300
    assert edge[80:145, 70:80].any(axis=1).mean() > 0.9  # the hole's left side, x = 100 → 75
    assert not edge[:280, 340:].any()
    assert "edge of the tissue mask (file qupath.geojson" in ex.display_panel.legend.value
    # no mask: nothing drawn, nothing said
    _type_mask(ex, "none")
    assert ex.run(wait=True) is not None, ex.status
    assert not _tissue_pixels(ex).any()
    assert "tissue mask" not in ex.display_panel.legend.value
    ex.close()


def test_the_side_panel_goes_under_the_image_where_the_output_is_narrow(slide):
    # seen in JupyterLab at 1280 px with the file browser open (its default): the output
    # area is 848 px wide and the two columns need at least 1000, so the side panel was cut
    # at the right edge (model and option boxes cut, Export CSV out of sight); a row that
    # wraps puts it under the image instead, and keeps both side by side where they fit
    ex = AttentionExplorer(str(slide), "demo", **FAST)
    top = ex.children[0]
    image_area, side = top.children
    needed = (int(image_area.layout.min_width.removesuffix("px"))
              + int(side.layout.min_width.removesuffix("px")) + 12)
    assert needed > 848
    assert top.layout.flex_flow == "row wrap"
    # and it wraps by its basis, not by its longest line (the model's description), which
    # put it under the image even in the 1100 px of a window with the file browser closed
    assert side.layout.flex == f"1 1 {side.layout.min_width}"
    assert needed <= 1100
    ex.close()


def test_the_overlay_choices_are_named_after_the_map_tested():
    # seen in JupyterLab: after a run of the attention rollout the overlay menu still offered
    # "raw attention" and "regularized attention" while the colour bar under the image said
    # "attention rollout (raw)" and the summary "keeps 0.0% of the attention rollout"
    from napari_attnreg.core.results.display import map_display

    image = np.random.default_rng(0).random((64, 64))
    ex = AttentionExplorer(image, "demo", n_boot=4, device="cpu", view="image", map="rollout")
    names = lambda: dict((v, k) for k, v in ex.display_panel.controls["overlay"].options)  # noqa: E731
    assert names()["attention"] == "raw attention"  # no result yet: the default map's names
    result = ex.run(wait=True)
    assert result is not None, ex.status
    assert names()["attention"] == "raw attention rollout"
    assert names()["regularized"] == "regularized attention rollout"
    ex.overlay = "attention"
    assert ex.display_panel.colorbar_label.value == map_display("attention", result).title(
        result.preset) == "attention rollout (raw)"
    ex.close()
