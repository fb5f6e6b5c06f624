"""The batch figure (issue #17): warnings once, equal panels, titled colour bars, a lone
significant patch that shows, and a scale bar where the pixel size is known."""

from __future__ import annotations

from dataclasses import replace

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Circle, Rectangle

from napari_attnreg import regularize
from napari_attnreg.batch.figure import figure_view, save_figure, scale_bar


@pytest.fixture
def drawn(monkeypatch):
    """The matplotlib figures saved meanwhile (kept for a look after they are closed)."""
    figures = []
    real = Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def _image_axes(fig):
    return [ax for ax in fig.axes if ax.images]


def test_a_lone_significant_patch_gets_a_ring_and_the_panels_are_equal(tiny_backbone,
                                                                      blob_image, tmp_path,
                                                                      drawn):
    result = regularize(blob_image, tiny_backbone, n_boot=8, device="cpu")
    result.metadata["spatial"] = {"scale": [0.25, 0.25], "units": ["µm", "µm"]}
    small, shown = figure_view(result, result.attention.repeat(16, 0).repeat(16, 1)[
        :blob_image.shape[0], :blob_image.shape[1]])
    lone = np.zeros(small.grid_shape, bool)
    lone[2, 3] = True
    small.significant = lambda *a, **k: lone.copy()
    save_figure(small, shown, tmp_path / "f.png", "title")
    (fig,) = drawn
    fig.canvas.draw()
    panels = _image_axes(fig)
    assert len(panels) == 5  # the image and four maps
    sizes = {tuple(np.round(ax.get_position().size, 3)) for ax in panels}
    assert len(sizes) == 1, sizes  # the image panel is as large as the map panels
    rings = [p for p in panels[-1].patches if isinstance(p, Circle)]
    assert len(rings) == 1
    ring_y, ring_x = rings[0].center[1], rings[0].center[0]
    rows, cols = np.nonzero(small.to_pixels(lone.astype(float)))
    assert rows.min() <= ring_y <= rows.max() and cols.min() <= ring_x <= cols.max()
    assert rings[0].radius >= 0.03 * max(shown.shape) and rings[0].get_linewidth() >= 2
    bars = [ax for ax in fig.axes if not ax.images and ax.collections]
    assert len(bars) == 4 and all(ax.get_title() for ax in bars)  # titled colour bars
    (scale,) = [p for p in panels[0].patches if isinstance(p, Rectangle)]
    length, label = scale_bar(shown.shape[1], 0.25, "µm")
    assert scale.get_width() == pytest.approx(length) and label == "2 µm"  # 80 px of 0.25 µm: a fifth is 4 µm
    assert label in [t.get_text() for t in panels[0].texts]


def test_no_scale_bar_without_a_pixel_size_and_none_for_no_significance(tiny_backbone,
                                                                        blob_image, tmp_path,
                                                                        drawn):
    result = regularize(blob_image, tiny_backbone, n_boot=8, device="cpu")
    display = np.zeros(blob_image.shape, np.float32)
    result.significant = lambda *a, **k: np.zeros(result.grid_shape, bool)
    save_figure(result, display, tmp_path / "g.png", "title")
    panels = _image_axes(drawn[0])
    assert len(panels[0].patches) == 0 and len(panels[0].texts) == 0
    assert not any(isinstance(p, Circle) for p in panels[-1].patches)


def test_figure_view_scales_the_pixel_size_with_the_display():
    from napari_attnreg.core.results.result import AttentionResult as R

    grid = np.ones((40, 30))
    maps = dict(z=grid, p=grid, lfdr=grid, posterior=grid, q=grid)
    result = R(attention=grid, maps=maps, pi0=1.0,
               thresholds={}, image_shape=(3000, 2250), model_shape=(320, 240),
               patch_size=(8, 8), metadata={"spatial": {"scale": [0.5, 0.5], "units": ["mm", "mm"]}})
    small, shown = figure_view(result, np.zeros((3000, 2250), np.float32), max_side=600)
    assert small.spatial["scale"] == pytest.approx((2.5, 2.5))  # 3000 px → 600 px
    assert small.spatial["units"] == ("mm", "mm")
    assert result.spatial["scale"] == (0.5, 0.5)  # the result file keeps its own


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_a_shrunk_figure_keeps_lines_a_pixel_wide(dtype):
    """Sampling every other pixel dropped every 1-px line on an even row of a 2048² slide
    from its 1024² figure; averaged, each line stays, at half its contrast."""
    from napari_attnreg.core.results.result import AttentionResult as R

    grid = np.ones((128, 128))
    result = R(attention=grid, maps=dict(z=grid, p=grid, lfdr=grid, posterior=grid, q=grid),
               pi0=1.0, thresholds={}, image_shape=(2048, 2048), model_shape=(2048, 2048),
               patch_size=(16, 16), metadata={})
    display = np.zeros((2048, 2048, 3), dtype)
    top = 1.0 if dtype == np.float32 else 255
    display[::8] = top  # lines on even rows
    display[4::8, :, 0] = top  # and red ones
    _, shown = figure_view(result, display)
    assert shown.shape == (1024, 1024, 3) and shown.dtype == dtype
    rows = shown[..., 1].astype(float).mean(axis=1) / top
    assert (rows[::4] > 0.2).all()  # every white line is there
    assert shown[2::4, :, 0].astype(float).mean() / top > 0.2  # every red one too
    assert rows[1::4].max() < rows[::4].min()  # and still lines, not a grey wash


def test_the_batch_figure_names_each_warning_once(tmp_path, drawn):
    import imageio.v3 as iio

    from napari_attnreg.cli import main

    rng = np.random.default_rng(0)
    img = (60 + 20 * rng.standard_normal((96, 96))).clip(0, 255).astype(np.uint8)
    iio.imwrite(tmp_path / "a.png", img)
    assert main(["run", str(tmp_path / "a.png"), "--out", str(tmp_path / "out"), "--model",
                 "demo", "--n-boot", "4", "--quiet", "--image-kind", "radiology",
                 "--figure", "overview"]) == 0
    (fig,) = drawn
    title = fig.get_suptitle()
    warnings = [line for line in title.splitlines() if line.startswith("⚠")]
    assert any("test article" in line for line in warnings)  # the stated kind's warning
    for line in warnings:
        assert title.count(line[2:]) == 1, line


# ---- the publication figure (core.results.figure), shared by napari, notebook and CLI --------
def test_publication_figure_draws_the_image_natively_with_bar_key_and_scale(tiny_backbone,
                                                                            blob_image,
                                                                            tmp_path, drawn,
                                                                            monkeypatch):
    import imageio.v3 as iio
    from matplotlib.lines import Line2D

    from napari_attnreg.core.results.figure import MIN_DRAWN_SIDE, publication_figure

    result = regularize(blob_image, tiny_backbone, n_boot=8, device="cpu")
    result.metadata["spatial"] = {"scale": [0.25, 0.25], "units": ["µm", "µm"]}
    lone = np.zeros(result.grid_shape, bool)
    lone[2, 3] = True
    monkeypatch.setattr(type(result), "significant", lambda self, *a, **k: lone.copy())
    path = publication_figure(result, blob_image, tmp_path / "pub.png", map_key="attention")
    (fig,) = drawn
    h, w = blob_image.shape[:2]
    k = -(-MIN_DRAWN_SIDE // max(h, w))  # a small image drawn at a whole multiple
    png = iio.imread(path)
    image_ax = next(ax for ax in fig.axes if ax.images)
    box = image_ax.get_window_extent()
    assert round(box.width) == w * k and round(box.height) == h * k  # never resampled down
    assert png.shape[1] > w * k  # the strip beside the image
    # one colour bar (the chosen map's), the outline's key, a scale bar in µm
    bars = [ax for ax in fig.axes if ax is not image_ax]
    assert len(bars) == 1 and "attention" in bars[0].get_ylabel().lower()
    (legend,) = fig.legends
    assert "significant (1 patch;" in legend.get_texts()[0].get_text()  # not "1 patches"
    texts = " ".join(t.get_text() for t in fig.texts)
    assert "Significant =" in texts  # what significant means under the preset
    assert any(isinstance(p, Rectangle) and p.get_label() == "scale bar"
               for p in image_ax.patches)
    assert any("µm" in t.get_text() for t in image_ax.texts)
    outline = [ln for ln in image_ax.lines if isinstance(ln, Line2D)]
    assert len(outline) == 1 and outline[0].get_linewidth() < 1.5  # thin: the patch shows


def test_publication_figure_refuses_an_image_of_another_size(tiny_backbone, blob_image,
                                                             tmp_path):
    from napari_attnreg.core.results.figure import publication_figure

    result = regularize(blob_image, tiny_backbone, n_boot=4, device="cpu")
    with pytest.raises(ValueError, match="pass the image the result belongs to"):
        publication_figure(result, blob_image[:10], tmp_path / "x.png")


def test_a_ring_at_the_image_edge_leaves_every_panel_the_same_size(tiny_backbone, blob_image,
                                                                   tmp_path, drawn,
                                                                   monkeypatch):
    result = regularize(blob_image, tiny_backbone, n_boot=4, device="cpu")
    corner = np.zeros(result.grid_shape, bool)
    corner[0, 0] = True  # its ring reaches past the image's corner
    monkeypatch.setattr(type(result), "significant", lambda self, *a, **k: corner.copy())
    display = blob_image.astype(float)
    save_figure(result, display, tmp_path / "edge.png", "title")
    (fig,) = drawn
    fig.canvas.draw()
    panels = _image_axes(fig)
    h, w = display.shape
    for ax in panels:  # the same data extent, so the same drawn image size
        np.testing.assert_allclose(ax.get_xlim(), (-0.5, w - 0.5))
        np.testing.assert_allclose(ax.get_ylim(), (h - 0.5, -0.5))
    widths = {round(ax.get_window_extent().width) for ax in panels}
    assert len(widths) == 1, widths


def test_the_cli_png_is_the_publication_figure_the_front_ends_write(tmp_path, drawn):
    """attnreg run writes the same figure as napari's Export figure and the notebook's
    export_figure (core.results.figure.publication_figure), by default."""
    import imageio.v3 as iio

    from napari_attnreg.cli import main
    from napari_attnreg.core.results.figure import publication_figure
    from napari_attnreg.core.results.result import AttentionResult

    rng = np.random.default_rng(0)
    img = (60 + 20 * rng.standard_normal((96, 96))).clip(0, 255).astype(np.uint8)
    iio.imwrite(tmp_path / "a.png", img)
    assert main(["run", str(tmp_path / "a.png"), "--out", str(tmp_path / "out"), "--model",
                 "demo", "--n-boot", "4", "--quiet"]) == 0
    (fig,) = drawn
    png = iio.imread(tmp_path / "out" / "a.png.attnreg.png")
    # the image drawn at native resolution or better, with the strip beside it
    (image_ax,) = _image_axes(fig)
    drawn_w = image_ax.get_position().width * fig.get_size_inches()[0] * fig.dpi
    assert drawn_w >= 96 and png.shape[1] > drawn_w
    assert any("significant" in t.get_text() for t in fig.legends[0].get_texts())
    assert not fig.get_suptitle()  # not the overview's title block
    # the figure the front ends write of the same result and image (up to display scaling)
    result = AttentionResult.load(tmp_path / "out" / "a.png.attnreg.npz")
    display = img.astype(np.float32) / 255
    again = publication_figure(result, display, tmp_path / "again.png")
    assert iio.imread(again).shape == png.shape
    assert np.abs(iio.imread(again).astype(int) - png.astype(int)).mean() < 1.0


def test_a_tiled_run_of_two_fluorescence_channels_draws_them_red_and_green(tmp_path, drawn):
    """A tiled run keeps a two-channel image's channels; its figure crashed in matplotlib
    ("Invalid shape (H, W, 2)") and took the batch down with it."""
    import tifffile

    from napari_attnreg.cli import main

    rng = np.random.default_rng(0)
    img = (rng.random((2, 96, 96)) * 4000).astype(np.uint16)
    img[1, 30:60, 30:60] += 20000  # a bright green object
    tifffile.imwrite(tmp_path / "two.ome.tif", img, metadata={"axes": "CYX"})
    assert main(["run", str(tmp_path / "two.ome.tif"), "--tiled", "--out",
                 str(tmp_path / "out"), "--model", "demo", "--n-boot", "4", "--quiet"]) == 0
    (fig,) = drawn
    (image_ax,) = _image_axes(fig)
    shown = np.asarray(image_ax.get_images()[0].get_array())
    assert shown.shape[-1] == 3 and not shown[..., 2].any()  # red, green and no blue
    assert shown[45, 45, 1] > shown[10, 10, 1] and shown[45, 45, 1] > shown[45, 45, 0]


def test_the_cli_overview_figure_stays_available(tmp_path, drawn):
    import imageio.v3 as iio

    from napari_attnreg.cli import main

    iio.imwrite(tmp_path / "a.png", np.random.default_rng(1).integers(0, 255, (64, 64), np.uint8))
    assert main(["run", str(tmp_path / "a.png"), "--out", str(tmp_path / "out"), "--model",
                 "demo", "--n-boot", "4", "--quiet", "--figure", "overview"]) == 0
    (fig,) = drawn
    assert len(_image_axes(fig)) == 5  # the image and four maps


def test_the_publication_figure_says_what_the_uncoloured_glass_is(tmp_path, drawn):
    """A masked tiled run leaves its glass uncoloured (the image shows through); nothing on
    the exported figure said that glass was never measured, where napari and the notebook
    say so."""
    from napari_attnreg.core.results.figure import publication_figure

    rng = np.random.default_rng(0)
    image = rng.random((256, 256)).astype(np.float32)
    tissue = np.zeros((256, 256), bool)
    tissue[:128, :128] = True
    masked = regularize(image, "demo", tiled=True, tissue_mask=tissue, n_boot=4, seed=0,
                        device="cpu")
    publication_figure(masked, image, tmp_path / "masked.png")
    (legend,) = drawn[-1].legends
    texts = [t.get_text().replace("\n", " ") for t in legend.get_texts()]
    md = masked.metadata
    assert len(texts) == 2 and "outside the tissue mask" in texts[1]
    assert f"{md['n_tissue_tiles']} of {md['n_tiles_total']} tiles run" in texts[1]
    everything = regularize(image, "demo", tiled=True, n_boot=4, seed=0, device="cpu")
    publication_figure(everything, image, tmp_path / "all.png")
    (legend,) = drawn[-1].legends
    assert len(legend.get_texts()) == 1  # no mask: nothing left uncoloured to explain


def test_the_meaning_lies_under_the_legend_however_long_its_entries(tmp_path, drawn):
    """A masked run's second legend entry took three lines and ran into the sentence saying
    what significant means (seen on an exported slide figure)."""
    from napari_attnreg.core.results.figure import publication_figure

    rng = np.random.default_rng(0)
    image = rng.random((192, 256)).astype(np.float32)  # a slide's 3:4, the figure low
    tissue = np.zeros((192, 256), bool)
    tissue[:128, :128] = True
    masked = regularize(image, "demo", tiled=True, tissue_mask=tissue, n_boot=4, seed=0,
                        device="cpu")
    # a slide's counts, as on the figure where it was seen: the entry wraps to three lines
    masked = replace(masked, metadata={**masked.metadata, "n_tissue_tiles": 105,
                                       "n_tiles_total": 336})
    publication_figure(masked, image, tmp_path / "masked.png")
    fig = drawn[-1]
    (legend,) = fig.legends
    below = legend.get_window_extent()
    (meaning,) = [t for t in fig.texts if "Significant" in t.get_text()]
    assert meaning.get_window_extent().y1 <= below.y0


def test_the_soft_rules_key_says_evidence_not_significant(tmp_path, drawn):
    from napari_attnreg.core.results.figure import publication_figure

    image = np.random.default_rng(0).random((128, 128)).astype(np.float32)
    soft = regularize(image, "demo", n_boot=4, seed=0, device="cpu").with_thresholds(
        rule="soft")
    publication_figure(soft, image, tmp_path / "soft.png")
    (legend,) = drawn[-1].legends
    first = legend.get_texts()[0].get_text().replace("\n", " ")
    assert first.startswith("evidence ≥ 0.5 (") and "attention × evidence" in first


@pytest.mark.parametrize("side", [64, 240])  # a figure at its least height, and a taller one
def test_a_class_maps_colour_bar_label_stays_in_the_figure_and_off_the_key(tmp_path, drawn,
                                                                          side):
    """Grad-CAM's label ("Grad-CAM for class 1: regularized (ForwardStop, α = 0.1)") ran
    off the top of the figure and into the key below its colour bar."""
    from test_maps_presets import tiny_classifier

    from napari_attnreg.core.results.figure import publication_figure

    rng = np.random.default_rng(0)
    image = rng.random((side, side)).astype(np.float32)
    image[8:24, 40:56] += 2.0
    result = regularize(image, tiny_classifier(), map="gradcam", target=1, n_boot=12,
                        device="cpu", chunk_size=6, seed=1)
    publication_figure(result, image, tmp_path / "class.png")
    fig = drawn[-1]
    fig.canvas.draw()
    label = next(ax.yaxis.label for ax in fig.axes if "Grad-CAM" in ax.yaxis.label.get_text())
    box, page = label.get_window_extent(), fig.bbox
    assert page.y0 <= box.y0 and box.y1 <= page.y1 and box.x1 <= page.x1
    (legend,) = fig.legends
    assert box.y0 >= legend.get_window_extent().y1
    assert "α\u00a0=\u00a00.1" in label.get_text()  # the rule is never split over two lines


def test_a_map_that_is_zero_everywhere_gets_a_zero_to_one_scale():
    from types import SimpleNamespace

    from napari_attnreg.core.results.display import MAPS_BY_KEY

    flat = SimpleNamespace(attention=np.zeros((4, 4)), metadata={})
    assert MAPS_BY_KEY["attention"].limits(flat) == (0.0, 1.0)  # not (0, 1e-12)
    glass = SimpleNamespace(attention=np.r_[0.2, 0.5, np.nan].reshape(1, 3), metadata={})
    assert MAPS_BY_KEY["attention"].limits(glass) == (0.0, 0.5)


def test_the_scale_bar_label_stays_on_a_narrow_image(tiny_backbone, tmp_path, drawn):
    """A whole-body scan 256 px wide at 2.4 mm per pixel: the "100 mm" label, centred over
    its short bar in the lower left corner, ran off the image's left edge ("00 mm")."""
    from napari_attnreg.core.results.figure import publication_figure

    rng = np.random.default_rng(0)
    image = (40 + 20 * rng.standard_normal((1024, 256))).clip(0, 255).astype(np.uint8)
    result = regularize(image, tiny_backbone, n_boot=4, device="cpu")
    result.metadata["spatial"] = {"scale": [2.4, 2.4], "units": ["mm", "mm"]}
    publication_figure(result, image, tmp_path / "narrow.png", map_key="attention")
    (fig,) = drawn
    (image_ax,) = _image_axes(fig)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    box = image_ax.get_window_extent(renderer)
    (label,) = [t for t in image_ax.texts if "mm" in t.get_text()]
    text = label.get_window_extent(renderer)
    assert box.x0 <= text.x0 and text.x1 <= box.x1, (label.get_text(), text, box)


def test_the_overview_keeps_small_raw_values_readable_and_titles_in_the_figure(tmp_path,
                                                                              drawn):
    """Grad-CAM of a DINOv2 encoder for a concept has raw values near 1e-4: the overview's
    colour bars printed ten ticks edge to edge ("0.00000.00010.0002..."), and the long
    class-map title of the last panel ran off the figure's right edge."""
    from test_maps_presets import tiny_classifier

    rng = np.random.default_rng(0)
    image = rng.random((64, 64)).astype(np.float32)
    image[8:24, 40:56] += 2.0
    concept = np.random.default_rng(2).standard_normal(192).astype(np.float32)
    result = regularize(image, tiny_classifier(), map="gradcam", target=concept, n_boot=12,
                        device="cpu", chunk_size=6, seed=1)
    result = replace(result, attention=result.attention * (7e-4 / result.attention.max()))
    save_figure(result, image, tmp_path / "o.png", "title")
    fig = drawn[-1]
    fig.canvas.draw()
    page = fig.bbox
    for ax in fig.axes:
        title = ax.title.get_window_extent()
        if ax.get_title():  # with a margin: saved at 90 dpi, text draws a little wider
            assert page.x0 <= title.x0 and title.x1 <= page.x1 - 0.01 * page.width, \
                ax.get_title()
        shown = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        boxes = sorted((t.get_window_extent() for t in shown), key=lambda b: b.x0)
        for left, right in zip(boxes, boxes[1:]):  # a character or two apart
            assert right.x0 - left.x1 >= left.height, [t.get_text() for t in shown]
