"""A pyramidal TIFF of several planes per level without OME metadata (fluorescence channels
stored as separate images) is refused saying what it is and how to convert it.

Before, every run of one (tiled or not, with or without --level) failed with "is not a
readable slide (NotImplementedError: series with axes='SYX' not supported yet); check that
the file is complete and that its extension matches its format": a good file called damaged.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")


def test_a_pyramid_of_separate_channel_planes_is_named_with_what_to_do(tmp_path):
    from napari_attnreg.cli import main

    rng = np.random.default_rng(5)
    planes = (rng.random((3, 520, 610)) * 4000).astype(np.uint16)  # three channels, planar
    path = tmp_path / "fluo scan.tif"
    with tifffile.TiffWriter(path) as tif:
        tif.write(planes, tile=(256, 256), subifds=1, photometric="minisblack",
                  planarconfig="separate", metadata=None)
        tif.write(planes[:, ::2, ::2].copy(), tile=(256, 256), subfiletype=1,
                  photometric="minisblack", planarconfig="separate", metadata=None)
    out = tmp_path / "out"
    code = main(["run", str(path), "--tiled", "--out", str(out), "--n-boot", "4",
                 "--device", "cpu", "--quiet"])
    summary = (out / "summary.csv").read_text(encoding="utf-8")
    assert code == 1
    assert "3 planes per level" in summary and "OME-TIFF pyramid" in summary
    assert "check that the file is complete" not in summary


@pytest.fixture()
def svs(tmp_path):
    """A small Aperio slide at 0.5 µm: level 0, its thumbnail, and a level at 1/4."""
    rng = np.random.default_rng(8)
    img = (rng.random((700, 900, 3)) * 80 + [140, 60, 130]).astype(np.uint8)
    img[:, :300] = 238

    def desc(w: int, h: int) -> str:
        return (f"Aperio Image Library v12.0.3\n{w}x{h} [0,0 {w}x{h}] (128x128) RAW/RGB"
                "|AppMag = 20|MPP = 0.5")

    path = tmp_path / "biopsy.svs"
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(128, 128), description=desc(900, 700), photometric="rgb",
                  metadata=None)
        tif.write(img[::8, ::8].copy(), description="Aperio Image Library v12.0.3\nthumb",
                  photometric="rgb", metadata=None)
        tif.write(img[::4, ::4].copy(), tile=(128, 128), description=desc(225, 175),
                  photometric="rgb", metadata=None)
    return path


@pytest.mark.parametrize("options, says", [
    (["--tile-scale", "2"], "give --mpp 1 "),
    (["--tile-scale", "4", "--level", "1"], "give --mpp 8 "),
    (["--merge", "mean"], "leave out --tiled"),
])
def test_a_tiled_slide_with_downsample_or_channel_options_says_what_to_give(
        svs, tmp_path, options, says):
    """Before: "Images read lazily are tiled at their own pixel size ...; for tile_scale,
    channels or merge read the image into memory", which no option of a slide run does."""
    from napari_attnreg import regularize
    from napari_attnreg.cli import main

    out = tmp_path / "out"
    code = main(["run", str(svs), "--tiled", "--out", str(out), "--n-boot", "4",
                 "--device", "cpu", "--quiet", *options])
    summary = (out / "summary.csv").read_text(encoding="utf-8")
    assert code == 1 and says in summary and "into memory" not in summary
    with pytest.raises(ValueError, match="coarser level or resolution|untiled run"):
        regularize(str(svs), tiled=True, n_boot=4, device="cpu",
                   **({"tile_scale": 2.0} if "--tile-scale" in options else {"merge": "mean"}))


def test_what_the_message_offers_runs(svs, tmp_path):
    from napari_attnreg.cli import main

    assert main(["run", str(svs), "--tiled", "--mpp", "1", "--out", str(tmp_path / "a"),
                 "--n-boot", "4", "--device", "cpu", "--quiet"]) == 0
    assert main(["run", str(svs), "--level", "1", "--merge", "mean", "--out",
                 str(tmp_path / "b"), "--n-boot", "4", "--device", "cpu", "--quiet"]) == 0


@pytest.mark.parametrize("resolution, unit, mpp", [
    (72, "INCH", None), (96, "INCH", None), (10, "CENTIMETER", None),  # programs' defaults
    (50800, "INCH", 0.5), (2000, "MILLIMETER", 0.5)])  # a microscope's
def test_a_programs_default_resolution_is_not_recorded_as_micrometres(
        tmp_path, resolution, unit, mpp):
    """A pyramid saved by a program that writes 72 dpi (or libvips' 1 pixel per mm) was
    recorded as 353 (or 1000) µm per pixel: scale bars and napari's µm placement a thousand
    times off, --mpp choosing levels by it."""
    from napari_attnreg.io.slides import open_slide

    rng = np.random.default_rng(2)
    img = (rng.random((512, 640, 3)) * 255).astype(np.uint8)
    path = tmp_path / "exported.tif"
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), subifds=1, photometric="rgb", metadata=None,
                  resolution=(resolution, resolution), resolutionunit=unit)
        tif.write(img[::2, ::2].copy(), tile=(256, 256), subfiletype=1, photometric="rgb",
                  metadata=None)
    image = open_slide(path)
    assert image.mpp == (pytest.approx(mpp) if mpp else None)
    assert ("spatial" in image.run_extra()) == (mpp is not None)
    if mpp is None:
        with pytest.raises(ValueError, match="dpi: a program's default"):
            open_slide(path, mpp=1.0)
