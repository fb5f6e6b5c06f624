"""A tiled TIFF of one image without a scanner's metadata (QuPath's, libvips' or tifffile's
export of a slide) above the untiled pixel budget is one thing to every front end: a slide
of one level, read on demand, with a slide's automatic tissue mask.

Before, napari showed it as a slide and its dock ran it so (it passes level 0), while
``attnreg run FILE --tiled`` without ``--level``/``--mpp`` (and ``regularize(path,
tiled=True)``, and a batch) read it as a plain image: no tissue mask, every tile of glass
tested, other p-values for the same file. The budget is shrunk here, as in the other slide
tests, so a small file stands for a 50000² one.
"""

from __future__ import annotations

import numpy as np
import pytest

tifffile = pytest.importorskip("tifffile")
pytest.importorskip("tiffslide")
pytest.importorskip("zarr")

from napari_attnreg.core.results.result import AttentionResult  # noqa: E402

H, W = 256, 224
BUDGET = 128 * 128  # the untiled pixel budget in these tests: the file is above it
RUN = {"n_boot": 4, "device": "cpu"}


def _pixels() -> np.ndarray:
    """Glass with a stained ellipse in its top-left corner."""
    rng = np.random.default_rng(11)
    img = np.full((H, W, 3), 236, np.uint8)
    yy, xx = np.mgrid[0:H, 0:W]
    tissue = (yy - 70) ** 2 / 60 ** 2 + (xx - 60) ** 2 / 50 ** 2 < 1
    stain = rng.random((H, W, 3)) * 90 + np.array([130, 40, 120])
    img[tissue] = stain[tissue].clip(0, 255).astype(np.uint8)
    return img


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "export.tif"
    tifffile.imwrite(path, _pixels(), tile=(128, 128), photometric="rgb")
    return path


@pytest.fixture
def small_budget(monkeypatch):
    from napari_attnreg.core.run import lazy

    monkeypatch.setattr(lazy, "MAX_UNTILED_PIXELS", BUDGET)


def _cli(path, out, *extra: str) -> AttentionResult:
    from napari_attnreg.cli import main

    assert main(["run", str(path), "--tiled", *extra, "--out", str(out), "--n-boot",
                 str(RUN["n_boot"]), "--device", RUN["device"], "--quiet"]) == 0
    [saved] = out.glob("*.attnreg.npz")
    return AttentionResult.load(saved)


def _same(a: AttentionResult, b: AttentionResult) -> None:
    assert a.image_shape == b.image_shape
    assert a.maps.keys() == b.maps.keys()
    for name in a.maps:
        np.testing.assert_array_equal(a.maps[name], b.maps[name], err_msg=name)
    for key in ("tissue_mask", "n_tissue_tiles", "n_tiles_total", "slide_level"):
        assert a.metadata.get(key) == b.metadata.get(key), key


def test_the_command_line_runs_a_large_tiled_tiff_as_the_dock_does(export, small_budget,
                                                                   tmp_path, capsys):
    from napari_attnreg import regularize
    from napari_attnreg.core.run.lazy import LazyImage
    from napari_attnreg.io.readers import open_for_run

    cli = _cli(export, tmp_path / "cli")
    md = cli.metadata
    assert md["tissue_mask"].startswith("auto") and md["slide_level"] == 0
    assert 0 < md["n_tissue_tiles"] < md["n_tiles_total"]  # the glass is left out
    assert "tissue_mask" in cli.null_summary
    assert "tissue patches" in capsys.readouterr().out  # the summary line says so
    # opened on demand, as a slide: never read whole
    image, _info = open_for_run(export, {"tiled": True})
    assert isinstance(image, LazyImage) and image.level == 0
    assert not isinstance(image.array, np.ndarray)
    # the dock's route (it asks for the layer's level, 0), the API's and a batch's
    dock = _cli(export, tmp_path / "dock", "--level", "0")
    api = regularize(export, "demo", tiled=True, **RUN)
    for other in (dock, api):
        _same(cli, other)


def test_below_the_budget_a_tiled_tiff_is_an_image_as_before(export, tmp_path):
    """Within the real budget: read on demand as a plain image, no slide level, no mask."""
    from napari_attnreg.core.run.lazy import LazyImage
    from napari_attnreg.io.readers import open_for_run
    from napari_attnreg.io.slides import is_large_tiled_image

    assert not is_large_tiled_image(export)
    image, _info = open_for_run(export, {"tiled": True})
    assert isinstance(image, LazyImage) and image.level is None
    result = _cli(export, tmp_path / "cli")
    assert result.metadata["tissue_mask"] == "none" and "slide_level" not in result.metadata


def test_only_a_tiled_tiff_of_one_image_without_slide_metadata_is_such_a_file(
        export, small_budget, tmp_path):
    from napari_attnreg.io.slides import is_large_tiled_image

    strips = tmp_path / "strips.tif"  # no tiles: read into memory, refused untiled
    tifffile.imwrite(strips, _pixels(), photometric="rgb")
    ome = tmp_path / "one.ome.tif"  # an OME-TIFF: read by its OME axes
    tifffile.imwrite(ome, _pixels(), tile=(128, 128), photometric="rgb")
    small = tmp_path / "small.tif"
    tifffile.imwrite(small, _pixels()[:64, :64], tile=(16, 16), photometric="rgb")
    assert is_large_tiled_image(export)
    assert not any(is_large_tiled_image(p) for p in (strips, ome, small))



def test_a_coarser_tiled_run_of_it_says_what_to_do_instead_of_reading_it_whole(
        export, small_budget):
    """The downsample option used to send it to the reader that holds an image whole (a
    50000² file in memory); now it is refused, naming what works for a file of one level."""
    from napari_attnreg.io.readers import open_for_run

    with pytest.raises(ValueError, match=r"no coarser level.*Leave the downsample at 1"):
        open_for_run(export, {"tiled": True, "tile_scale": 2.0})


def test_the_notebook_shows_and_runs_it_as_a_slide(tmp_path, small_budget):
    """The explorer held it as a plain image read on demand: no pixel size before a run,
    though its runs were a slide's. It is a slide of one level there too."""
    pytest.importorskip("ipywidgets")
    from napari_attnreg.notebook import AttentionExplorer
    from napari_attnreg.notebook.sources import open_file

    path = tmp_path / "export_mpp.tif"
    tifffile.imwrite(path, _pixels(), tile=(128, 128), photometric="rgb",
                     resolution=(1e4 / 0.5, 1e4 / 0.5), resolutionunit="CENTIMETER")
    source = open_file(path)
    assert source.slide and source.pyramid
    assert source.image.level == 0 and source.image.mpp == pytest.approx(0.5)
    ex = AttentionExplorer(str(path), "demo", tiled=True, **RUN)
    result = ex.run(wait=True)
    assert result is not None, ex.status
    cli = _cli(path, tmp_path / "cli")
    _same(result, cli)
    assert result.spatial == cli.spatial
    assert result.metadata["tissue_mask"].startswith("auto")
    ex.close()
