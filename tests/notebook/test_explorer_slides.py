"""Whole-slide images and image files in the notebook explorer, read as the command line reads
them: a slide is shown from its overview, never read whole for display, and each run reads it
at the Advanced panel's level / resolution with the tissue mask the engine chooses."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")

from napari_attnreg.core.results.result import AttentionResult  # noqa: E402
from napari_attnreg.core.run.lazy import LazyImage, check_untiled_size  # noqa: E402
from napari_attnreg.io.slides import open_slide  # noqa: E402
from napari_attnreg.notebook import AttentionExplorer  # noqa: E402
from napari_attnreg.notebook.explorer import NO_DRAWING  # noqa: E402
from napari_attnreg.notebook.sources import DiskSource  # noqa: E402

SIZE = 2048
TISSUE = (0.55, 0.55)  # the tissue block's share of each side: ~30 % tissue, 70 % glass
PATCH = 8  # the bundled demo model
FAST = {"n_boot": 4, "device": "cpu", "view": "image"}
#: Options under which the demo model finds significant regions in a few null images.
FOUND = {"preset": "directional", "rule": "p", "p_th": 0.3, "n_boot": 6, "seed": 0}


def _slide_pixels(size: int = SIZE) -> np.ndarray:
    rng = np.random.default_rng(0)
    img = np.full((size, size, 3), 236, np.uint8)  # white glass
    th, tw = int(size * TISSUE[0]), int(size * TISSUE[1])
    stain = rng.random((th, tw, 3)) * 90 + np.array([130, 40, 120])  # pink-purple H&E-ish
    img[:th, :tw] = stain.clip(0, 255).astype(np.uint8)
    return img


def _aperio(w: int, h: int) -> str:
    return (f"Aperio Image Library v10.0.50\n{w}x{h} [0,0 {w}x{h}] (256x256) RAW/RGB"
            "|AppMag = 40|MPP = 0.25")


@pytest.fixture(scope="module")
def slide(tmp_path_factory) -> Path:
    """An Aperio-style SVS of 2048² at 0.25 µm, levels 1/2 and 1/4, a thumbnail; 70 % glass."""
    path = tmp_path_factory.mktemp("slides") / "slide.svs"
    img = _slide_pixels()
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), description=_aperio(SIZE, SIZE), photometric="rgb",
                  metadata=None)
        tif.write(img[::16, ::16].copy(), description="Aperio Image Library v10.0.50\nthumb",
                  photometric="rgb", metadata=None)
        for k in (2, 4):
            tif.write(img[::k, ::k].copy(), tile=(256, 256),
                      description=_aperio(SIZE // k, SIZE // k), photometric="rgb",
                      metadata=None)
    return path


@pytest.fixture
def reads(monkeypatch):
    """Every ``LazyImage.read`` as ``(stored shape of the level, shape read)``; reading a
    level whole (``read_whole``) fails the test until ``allow_whole()``."""
    seen: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    read, whole = LazyImage.read, LazyImage.read_whole

    def recorded(self, ys, xs):
        block = read(self, ys, xs)
        seen.append((tuple(self.shape), block.shape[:2]))
        return block

    def refused(self):
        raise AssertionError(f"{self.path} level {self.level} was read whole")

    monkeypatch.setattr(LazyImage, "read", recorded)
    monkeypatch.setattr(LazyImage, "read_whole", refused)
    def allow_whole() -> None:
        monkeypatch.setattr(LazyImage, "read_whole", whole)

    return seen, allow_whole


def _set(explorer: AttentionExplorer, **advanced: str) -> None:
    """Type values into the Advanced panel's boxes, as a user does."""
    for name, text in advanced.items():
        explorer.options_panel.advanced.controls[name].value = text


# -- showing a slide ------------------------------------------------------------------------

@pytest.mark.parametrize("opened", [False, True], ids=["path", "open_slide"])
def test_a_slide_is_shown_from_its_overview_and_never_read_whole(slide, reads, opened):
    seen, _ = reads
    image = open_slide(slide) if opened else str(slide)
    ex = AttentionExplorer(image, "demo", tiled=True, **FAST)
    assert ex.status == "Ready: press Run.", ex.status
    assert ex.image_panel.plane_shape == (SIZE, SIZE)  # the picture's frame: full resolution
    assert ex.image_panel.grid.shape == (768, 768) == ex.rendered.shape[:2]
    # only coarser levels were read for the picture: level 0 (2048²) never
    assert seen and all(level != (SIZE, SIZE) for level, _ in seen)
    # and it is the slide: stained tissue top left, white glass elsewhere
    base = ex.image_panel.base
    tissue = int(768 * TISSUE[0])
    assert base[: tissue - 4, : tissue - 4].mean() < 0.7
    np.testing.assert_allclose(base[tissue + 4:, tissue + 4:], 236 / 255, atol=1e-6)
    # a region is a shape on the picture: adding one reads no pixels of the slide
    n_reads = len(seen)
    assert ex.add_roi(rectangle=(0, 0, 100, 100)) == 1 and len(seen) == n_reads
    assert ex.controls["draw"].tooltip == NO_DRAWING  # this plain-image view cannot draw
    # a fingerprint is the file's identity, never a hash of the slide's pixels
    n_reads = len(seen)
    assert str(slide.resolve()) in ex.runs.fingerprint(())
    assert len(seen) == n_reads
    ex.close()


def test_the_file_changing_during_a_run_drops_its_result(slide, tmp_path, monkeypatch):
    copy = tmp_path / "copy.svs"
    copy.write_bytes(slide.read_bytes())
    prepare = DiskSource.prepare

    def touched(self, job):  # the scanner rewrites the file while the run reads it
        stat = copy.stat()
        os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        return prepare(self, job)

    monkeypatch.setattr(DiskSource, "prepare", touched)
    ex = AttentionExplorer(str(copy), "demo", tiled=True, level=2, **FAST)
    assert ex.run(wait=True) is None and ex.result is None
    assert "image changed during the run" in ex.status
    ex.close()


# -- tiled runs: level, resolution, tissue mask ---------------------------------------------

def test_a_tiled_run_of_a_path_reads_level_0_with_the_automatic_tissue_mask(slide, reads):
    ex = AttentionExplorer(str(slide), "demo", tiled=True, **FAST)
    result = ex.run(wait=True)  # read_whole would fail it: tile by tile only
    assert result is not None, ex.status
    md = result.metadata
    assert result.image_shape == (SIZE, SIZE) and md["slide_level"] == 0
    assert md["slide_downsample"] == 1.0 and result.spatial["scale"] == (0.25, 0.25)
    assert md["tissue_mask"].startswith("auto") and md["n_tissue_tiles"] < md["n_tiles_total"]
    assert md["image_kind"] == "pathology" and md["source"] == str(slide)
    assert "tissue_mask" in result.null_summary
    ex.close()


@pytest.mark.parametrize("opened", [False, True], ids=["path", "open_slide"])
def test_a_level_gives_a_result_that_lies_on_the_overview(slide, reads, opened):
    image = open_slide(slide, level=1) if opened else str(slide)
    ex = AttentionExplorer(image, "demo", tiled=True, **FAST)
    if not opened:
        _set(ex, level="1")
    result = ex.run(wait=True)
    assert result is not None, ex.status
    md = result.metadata
    assert result.image_shape == (1024, 1024) and result.grid_shape == (128, 128)
    assert (md["slide_level"], md["slide_downsample"]) == (1, 2.0)
    assert result.spatial["scale"] == (0.5, 0.5) and md["tissue_mask"].startswith("auto")
    assert md["level"] == (None if opened else 1)  # as asked: the command line records it so
    # each display pixel shows the token over its centre, in the picture's frame
    shown = ex.image_panel.plane_shape
    hd = ex.image_panel.grid.shape[0]
    centre = (np.arange(hd) + 0.5) * shown[0] / hd  # display pixel centres, picture pixels
    level1 = centre * (1 if opened else 0.5)
    token = np.minimum((level1 // PATCH).astype(int), 127)
    np.testing.assert_array_equal(ex.canvas.token_index, token[:, None] * 128 + token[None, :])
    assert ex.rendered.shape[:2] == ex.image_panel.grid.shape
    # the cursor reads the patch under it in the picture's pixels
    y = 1000 if not opened else 500  # level 0 pixel 1000 = level 1 pixel 500 = patch 62
    assert "patch (62,62)" in ex.canvas.describe_pixel(y, y)
    # ... and says where it is at full resolution, as napari, QuPath and the GeoJSON do
    assert ex.canvas.describe_pixel(y, y).startswith("x=1000 y=1000 (level 0) · ")
    ex.close()


def test_glass_the_tissue_mask_left_out_shows_the_slide_not_a_map_of_zero(slide):
    # tokens of tiles that were never run have attention 0 and p = 1, which say nothing: the
    # publication figure lets the image show through there, and so must the explorer's view
    ex = AttentionExplorer(str(slide), "demo", tiled=True, level=2, overlay="attention",
                           outline=False, **FAST)
    result = ex.run(wait=True)
    assert result is not None, ex.status
    assert result.metadata["n_tissue_tiles"] < result.metadata["n_tiles_total"]
    image = np.round(ex.image_panel.base * 255).astype(np.uint8)
    far = slice(700, None)  # display pixels over glass, far from every tissue tile
    np.testing.assert_array_equal(ex.rendered[far, far], image[far, far])
    assert np.abs(ex.rendered[:300, :300].astype(int) - image[:300, :300]).mean() > 5
    ex.close()


def test_a_resolution_reads_the_level_at_least_as_fine_and_resamples(slide):
    ex = AttentionExplorer(str(slide), "demo", tiled=True, **FAST)
    _set(ex, mpp="0.75")
    result = ex.run(wait=True)
    assert result is not None, ex.status
    md = result.metadata
    assert md["slide_level"] == 1 and md["slide_resample"] == pytest.approx(1.5)
    assert result.spatial["scale"] == pytest.approx((0.75, 0.75))
    assert result.image_shape == (680, 680)  # 683 analysed pixels, whole patches only
    assert ex.canvas.token_index[-1, -1] == result.grid_shape[0] * result.grid_shape[1] - 1
    ex.close()


def test_a_qupath_geojson_outline_is_the_tissue_mask_at_any_level(slide, tmp_path):
    # QuPath writes full-resolution pixels: the tissue block (0..1126 of 2048) outlined there
    side = int(SIZE * TISSUE[0])
    ring = [[0, 0], [side, 0], [side, side], [0, side], [0, 0]]
    path = tmp_path / "tissue.geojson"
    path.write_text(json.dumps({"type": "FeatureCollection", "features": [
        {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [ring]}}]}))
    ex = AttentionExplorer(str(slide), "demo", tiled=True, level=2, **FAST)
    _set(ex, tissue_mask=str(path))
    result = ex.run(wait=True)
    assert result is not None, ex.status
    md = result.metadata
    assert md["tissue_mask"].startswith("file tissue.geojson (GeoJSON") and md["slide_level"] == 2
    ex.close()
    # the same tiles as the command line's run of the slide with that outline
    from napari_attnreg.api import regularize

    cli = regularize(str(slide), "demo", tiled=True, level=2, tissue_mask=str(path), **{
        k: v for k, v in FAST.items() if k != "view"})
    assert np.array_equal(result.null_summary["tissue_tiles"], cli.null_summary["tissue_tiles"])
    assert 0 < md["n_tissue_tiles"] < md["n_tiles_total"]


def test_the_tissue_mask_option_and_the_rule_for_microscopy_pyramids(slide, tmp_path):
    ex = AttentionExplorer(str(slide), "demo", tiled=True, level=2, **FAST)
    _set(ex, tissue_mask="none")
    result = ex.run(wait=True)
    assert result is not None, ex.status
    assert result.metadata["tissue_mask"] == "none"
    ex.close()
    # an OME-TIFF pyramid is microscopy, not a stained slide: no automatic mask (the engine's
    # rule, as for the command line), and its pixel size comes from its OME-XML
    path = tmp_path / "pyramid.ome.tif"
    img = _slide_pixels(1024)
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(img, tile=(256, 256), subifds=2, photometric="rgb",
                  metadata={"axes": "YXS", "PhysicalSizeX": 0.5, "PhysicalSizeY": 0.5})
        for k in (2, 4):
            tif.write(img[::k, ::k].copy(), tile=(128, 128), subfiletype=1, photometric="rgb")
    ex = AttentionExplorer(str(path), "demo", tiled=True, level=2, **FAST)
    assert ex.image_panel.plane_shape == (1024, 1024)
    result = ex.run(wait=True)
    assert result is not None, ex.status
    md = result.metadata
    assert md["image_kind"] == "microscopy" and md["tissue_mask"] == "none"
    assert md["slide_level"] == 2 and result.spatial["scale"] == pytest.approx((2.0, 2.0))
    ex.close()


# -- untiled runs ----------------------------------------------------------------------------

def _budget(monkeypatch, pixels: int) -> None:
    """A smaller untiled pixel budget, for the explorer's choice and the core's check."""
    monkeypatch.setattr("napari_attnreg.notebook.sources.MAX_UNTILED_PIXELS", pixels)
    monkeypatch.setattr("napari_attnreg.core.run.api.check_untiled_size",
                        functools.partial(check_untiled_size, limit=pixels))


def test_an_untiled_run_reads_the_finest_level_the_budget_holds(slide, monkeypatch):
    _budget(monkeypatch, 600 * 600)  # level 2 (512²) is the finest that fits
    ex = AttentionExplorer(str(slide), "demo", **FAST)
    result = ex.run(wait=True)
    assert result is not None, ex.status
    md = result.metadata
    assert result.image_shape == (512, 512) and md["tiled"] is False
    assert (md["level"], md["slide_level"], md["slide_downsample"]) == (2, 2, 4.0)
    assert result.spatial["scale"] == (1.0, 1.0) and md["tissue_mask"] is None
    assert ex.canvas.token_index.shape == ex.image_panel.grid.shape
    _set(ex, level="1")  # a level asked is read whatever the budget says ...
    _budget(monkeypatch, 300 * 300)
    assert ex.run(wait=True) is None
    assert "run it tiled" in ex.status and "'Tiled' in napari" in ex.status  # ... or refused
    _set(ex, level="")  # no level fits: the coarsest is refused, naming Tiled
    assert ex.run(wait=True) is None and "run it tiled" in ex.status
    np.testing.assert_array_equal(ex.result.attention, result.attention)  # it stays
    ex.close()


def test_an_opened_slide_keeps_its_level_and_refuses_others_as_regularize_does(slide, reads):
    from napari_attnreg import regularize

    _, allow_whole = reads
    ex = AttentionExplorer(open_slide(slide, level=2), "demo", **FAST)
    allow_whole()  # an untiled run reads the level it was opened at whole
    result = ex.run(wait=True)
    assert result is not None, ex.status
    assert result.image_shape == (512, 512) and result.metadata["slide_level"] == 2
    for option, text in (("level", "1"), ("mpp", "0.5")):
        _set(ex, **{option: text})
        with pytest.raises(ValueError) as refused:
            regularize(open_slide(slide, level=2), "demo", n_boot=4, device="cpu",
                       **{option: float(text) if option == "mpp" else int(text)})
        assert ex.run(wait=True) is None
        assert ex.status.startswith(str(refused.value)), ex.status
        _set(ex, **{option: ""})
    ex.close()


# -- the same outputs as the command line ---------------------------------------------------

@pytest.mark.parametrize("tiled", [True, False], ids=["tiled", "untiled"])
def test_result_figure_and_geojson_match_the_command_lines(slide, tmp_path, tiled):
    import imageio.v3 as iio

    from napari_attnreg.cli import main

    out = tmp_path / "cli"
    flags = ["--tiled"] if tiled else []
    assert main(["run", str(slide), *flags, "--level", "2", "--out", str(out), "--model",
                 "demo", "--preset", "directional", "--rule", "p", "--p-th", "0.3",
                 "--n-boot", "6", "--device", "cpu", "--geojson", "--quiet"]) == 0
    cli = AttentionResult.load(out / "slide.svs.attnreg.npz")
    ex = AttentionExplorer(str(slide), "demo", tiled=tiled, level=2, device="cpu",
                           view="image", **FOUND)
    assert ex.run(wait=True) is not None, ex.status
    saved = AttentionResult.load(ex.save(tmp_path / "nb.attnreg.npz"))
    np.testing.assert_array_equal(saved.attention, cli.attention)
    assert sorted(saved.maps) == sorted(cli.maps)
    for name in saved.maps:
        np.testing.assert_array_equal(saved.maps[name], cli.maps[name])
    assert saved.image_shape == cli.image_shape == (512, 512)
    assert saved.significant().sum() > 0
    for key in ("level", "tiled", "tissue_mask", "image_kind", "spatial"):
        assert saved.metadata.get(key) == cli.metadata.get(key), key
    # the explorer records the level read for an untiled run too (the dock does)
    assert (saved.metadata["slide_level"], saved.metadata["slide_downsample"]) == (2, 4.0)
    if tiled:
        assert saved.metadata["slide_downsample"] == cli.metadata["slide_downsample"]

    # GeoJSON in full-resolution pixels: the command line's regions, at level 0's scale
    ours = json.loads(ex.export_geojson(tmp_path / "nb.geojson").read_text())
    theirs = json.loads((out / "slide.svs.geojson").read_text())
    assert ours["properties"]["full_resolution_per_pixel"] == 4.0
    factor = 4.0 / theirs["properties"]["full_resolution_per_pixel"]
    assert len(ours["features"]) == len(theirs["features"]) > 0
    for a, b in zip(ours["features"], theirs["features"], strict=True):
        np.testing.assert_allclose(np.asarray(a["geometry"]["coordinates"][0]),
                                   np.asarray(b["geometry"]["coordinates"][0]) * factor)

    # the figure: the publication figure at the resolution analysed, the command line's
    # (which draws a tiled run over the slide's overview: the level itself at its coarsest)
    ours_png = iio.imread(ex.export_figure(tmp_path / "nb.png"))
    np.testing.assert_array_equal(ours_png, iio.imread(out / "slide.svs.attnreg.png"))
    ex.close()


# -- plain image files -----------------------------------------------------------------------

def _write_ome_tif(path: Path, shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[0:shape[0], 0:shape[1]]
    img = 300 + 30 * rng.standard_normal(shape)
    img += 2500 * np.exp(-((yy - shape[0] / 3) ** 2 + (xx - shape[1] / 2) ** 2) / 200)
    img = img.clip(0, 65535).astype(np.uint16)
    tifffile.imwrite(path, img, ome=True,
                     metadata={"axes": "YX", "PhysicalSizeX": 0.65, "PhysicalSizeY": 0.65})


@pytest.mark.parametrize("tiled", [False, True], ids=["untiled", "tiled"])
def test_a_tif_path_runs_as_the_command_line_reads_it(tmp_path, tiled):
    from napari_attnreg.cli import main

    path = tmp_path / "field.ome.tif"
    _write_ome_tif(path, (300, 200))
    ex = AttentionExplorer(str(path), "demo", tiled=tiled, **FAST)
    assert ex.image_panel.plane_shape == (300, 200)
    label = ex.add_roi(rectangle=(40, 40, 160, 160))  # a file in memory takes regions
    result = ex.run(wait=True)
    assert result is not None, ex.status
    md = result.metadata
    assert result.spatial["scale"] == pytest.approx((0.65, 0.65))
    assert md["image_kind"] == "microscopy" and md["source"] == str(path)
    # a tiled run reads the TIFF on demand, as the command line: whole patches only
    assert result.image_shape == ((296, 200) if tiled else (300, 200))
    assert [row["label"] for row in ex.roi_table()] == [label]
    figure = ex.export_figure(tmp_path / "f.png")
    assert figure.is_file()
    out = tmp_path / "cli"
    assert main(["run", str(path), *(["--tiled"] if tiled else []), "--out", str(out),
                 "--model", "demo", "--n-boot", "4", "--device", "cpu", "--quiet"]) == 0
    cli = AttentionResult.load(out / "field.ome.tif.attnreg.npz")
    np.testing.assert_array_equal(result.attention, cli.attention)
    assert cli.spatial == result.spatial and cli.image_shape == result.image_shape
    # the explorer's copy is its own: the file's identity tells a change, not its pixels
    assert str(path.resolve()) in ex.runs.fingerprint(())
    ex.close()


def test_a_png_path_and_bad_paths(tmp_path):
    import imageio.v3 as iio

    rgb = np.zeros((120, 160, 3), np.uint8)
    rgb[30:90, 40:120] = (200, 60, 140)
    rgb += np.random.default_rng(0).integers(0, 30, rgb.shape, dtype=np.uint8)
    iio.imwrite(tmp_path / "cells.png", rgb)
    ex = AttentionExplorer(tmp_path / "cells.png", "demo", **FAST)  # a Path as well as a str
    assert ex.image_panel.plane_shape == (120, 160)
    result = ex.run(wait=True)
    assert result is not None, ex.status
    assert result.metadata["source"] == str(tmp_path / "cells.png")
    assert ex.provenance()["source_image"] == str(tmp_path / "cells.png")
    ex.set_image(str(tmp_path / "missing.svs"))
    assert "No such image file" in ex.status  # the image and its result stay
    np.testing.assert_array_equal(ex.result.attention, result.attention)
    ex.set_image(str(tmp_path / "cells.png"), rgb=False)
    assert "rgb= is for arrays" in ex.status
    ex.close()
