"""A pyramid's stated pixel size: kept when it can be measured, however large (a radiograph or
a gross photograph saved as a pyramid is 100–200 µm per pixel), ignored when it is a program's
default resolution tags (72, 96, 300 dpi, libvips' 1 pixel per mm) or beyond 10 mm per pixel.

Before, every size above 50 µm was dropped: a 150 µm radiograph pyramid lost its scale bar,
its µm outputs and ``--mpp``. The same rule holds for pyramidal TIFFs, OME-TIFF pyramids and
DICOM whole-slide images.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")

from napari_attnreg.io.slides import open_slide, stated_mpp  # noqa: E402

#: (µm per pixel the file states, kept?)
SIZES = [
    (150.0, True), (120.0, True), (200.0, True), (25400 / 600, True), (0.25, True),
    (25400 / 72, False), (25400 / 96, False), (25400 / 300, False), (1000.0, False),
    (25400.0, False), (20000.0, False)]


def _pyramid(path: Path, mpp: float) -> Path:
    """A 512x640 pyramidal TIFF (one sub-IFD) whose resolution tags state ``mpp``."""
    img = (np.random.default_rng(2).random((512, 640, 3)) * 255).astype(np.uint8)
    per_cm = 1e4 / mpp
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), subifds=1, photometric="rgb", metadata=None,
                  resolution=(per_cm, per_cm), resolutionunit="CENTIMETER")
        tif.write(img[::2, ::2].copy(), tile=(256, 256), subfiletype=1, photometric="rgb",
                  metadata=None)
    return path


@pytest.mark.parametrize("mpp, kept", SIZES)
def test_a_pyramidal_tiffs_size_is_kept_unless_a_programs_default(tmp_path, mpp, kept):
    path = _pyramid(tmp_path / "scan.tif", mpp)
    image = open_slide(path)
    if kept:
        assert image.mpp == pytest.approx(mpp, rel=1e-4)
        assert image.run_extra()["spatial"]["scale"] == [pytest.approx(mpp, rel=1e-4)] * 2
        coarser = open_slide(path, mpp=2 * mpp)  # --mpp chooses a level by it
        assert (coarser.level, coarser.scale) == (1, 1.0)
        return
    assert image.mpp is None and "spatial" not in image.run_extra()
    with pytest.raises(ValueError) as refused:
        open_slide(path, mpp=1.0)
    # the message says what the tags held, and why it is no pixel size
    held = f"its TIFF tags say {mpp:.5g} µm per pixel, {25400 / mpp:.4g} dpi: "
    assert held in str(refused.value)
    why = "over 10 mm per pixel" if mpp == 20000 else "a program's default"
    assert why in str(refused.value) and "choose a level instead" in str(refused.value)


@pytest.mark.parametrize("mpp, kept", [(150.0, True), (352.7778, False)])
def test_an_svs_whose_description_states_the_size_follows_the_same_rule(tmp_path, mpp, kept):
    img = (np.random.default_rng(6).random((512, 512, 3)) * 255).astype(np.uint8)
    path = tmp_path / "gross.svs"
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), photometric="rgb", metadata=None,
                  description="Aperio Image Library v10.0.50\n512x512 [0,0 512x512] (256x256) "
                              f"RAW/RGB|MPP = {mpp}")
    image = open_slide(path)
    assert image.mpp == (pytest.approx(mpp) if kept else None)
    if not kept:  # not the TIFF tags: the scanner's description said it
        with pytest.raises(ValueError, match="its aperio metadata says 352.78 µm per pixel"):
            open_slide(path, mpp=1000.0)


def test_the_command_line_names_what_the_tags_held(tmp_path, capsys):
    from napari_attnreg.cli import main

    path = _pyramid(tmp_path / "export.tif", 25400 / 96)
    code = main(["run", str(path), "--tiled", "--mpp", "2", "--out", str(tmp_path / "out"),
                 "--n-boot", "4", "--device", "cpu", "--quiet"])
    said = capsys.readouterr()
    assert code != 0
    assert "264.58 µm per pixel, 96 dpi: a program's default (Windows'" in said.err + said.out


def test_the_rule_itself():
    assert stated_mpp(None, "x") == (None, None)
    assert stated_mpp(352.8, "x")[0] is None  # 72 dpi written to a few digits
    assert stated_mpp(352.0, "x") == (352.0, None)  # not a default: kept
    assert stated_mpp(9000.0, "x") == (9000.0, None)
    assert "over 10 mm" in stated_mpp(12000.0, "its TIFF tags say")[1]


# -- OME-TIFF pyramids -----------------------------------------------------------------------

def _ome(path: Path, mpp: float) -> Path:
    pytest.importorskip("zarr")
    img = (np.random.default_rng(4).random((512, 512, 3)) * 255).astype(np.uint8)
    metadata = {"axes": "YXS", "PhysicalSizeX": mpp, "PhysicalSizeY": mpp,
                "PhysicalSizeXUnit": "µm", "PhysicalSizeYUnit": "µm"}
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(img, tile=(256, 256), subifds=1, photometric="rgb", metadata=metadata)
        tif.write(img[::2, ::2].copy(), tile=(256, 256), subfiletype=1, photometric="rgb")
    return path


@pytest.mark.parametrize("mpp, kept", [(150.0, True), (25400 / 72, False), (1000.0, False)])
def test_an_ome_pyramid_follows_the_same_rule_in_napari_and_in_a_run(tmp_path, mpp, kept):
    from napari_attnreg._napari.io import get_reader
    from napari_attnreg.io.ometiff import open_ome_level

    path = _ome(tmp_path / "photo.ome.tif", mpp)
    [(_, kwargs, _)] = get_reader(str(path))(str(path))
    image = open_ome_level(path)
    if kept:
        assert kwargs["scale"] == (pytest.approx(mpp),) * 2 and kwargs["units"] == ("µm", "µm")
        assert kwargs["metadata"]["slide"]["mpp"] == pytest.approx(mpp)
        assert image.mpp == pytest.approx(mpp)
        return
    # the layer is in pixels, as the run records no µm: the two stay on one frame
    assert kwargs["scale"] == (1.0, 1.0) and "units" not in kwargs
    assert kwargs["metadata"]["slide"]["mpp"] is None and image.mpp is None
    with pytest.raises(ValueError, match="its OME-XML says .* a program's default"):
        open_ome_level(path, mpp=1000.0)


# -- DICOM whole-slide images ----------------------------------------------------------------

@pytest.mark.parametrize("mm, kept", [(0.15, True), (25.4 / 72, False)])
def test_a_dicom_slide_follows_the_same_rule(tmp_path, mm, kept):
    pytest.importorskip("pydicom", minversion="3.0")
    from test_dicom_wsi import _pixels, write_level

    from napari_attnreg.io.dicom_wsi import open_dicom_slide, wsi_pyramid

    folder = tmp_path / "slide"
    folder.mkdir()
    write_level(folder / "level0.dcm", _pixels(), mm, series="1.2.3", number=1)
    pyramid = wsi_pyramid(folder).pyramid
    if kept:
        assert pyramid.mpp == pytest.approx(1000 * mm)
        assert open_dicom_slide(folder).mpp == pytest.approx(1000 * mm)
        return
    assert pyramid.mpp is None and open_dicom_slide(folder).mpp is None
    with pytest.raises(ValueError, match="its DICOM PixelSpacing says 352.78 µm per pixel, "
                                         "72 dpi: a program's default"):
        open_dicom_slide(folder, mpp=1000.0)


@pytest.mark.parametrize("mpp, kept", SIZES[:7])
def test_a_plain_tiff_under_the_budget_reads_its_tags_as_a_large_one_does(tmp_path, mpp, kept):
    # a TIFF below 8192² was read without its resolution tags (no scale bar, no µm outputs)
    # while the same file above it, a slide of one level, kept them
    from napari_attnreg.io.readers import image_info, read_source

    img = (np.random.default_rng(3).random((96, 128, 3)) * 255).astype(np.uint8)
    tifffile.imwrite(tmp_path / "cm.tif", img, resolution=(1e4 / mpp, 1e4 / mpp),
                     resolutionunit="CENTIMETER")
    tifffile.imwrite(tmp_path / "ij.tif", img, imagej=True, resolution=(1 / mpp, 1 / mpp),
                     metadata={"unit": "micron"})
    for name in ("cm.tif", "ij.tif"):
        info = image_info(tmp_path / name)
        want = (pytest.approx(mpp), pytest.approx(mpp)) if kept else None
        assert info.pixel_size == want and info.unit == ("µm" if kept else None)
        assert read_source(tmp_path / name)[1].pixel_size == info.pixel_size
    tifffile.imwrite(tmp_path / "none.tif", img)
    assert image_info(tmp_path / "none.tif").pixel_size is None


def test_a_plain_tiffs_tagged_size_reaches_the_run_and_its_scale_bar(tmp_path):
    from napari_attnreg.cli import main

    img = (np.random.default_rng(4).random((160, 200)) * 255).astype(np.uint8)
    tifffile.imwrite(tmp_path / "cells.tif", img, imagej=True, resolution=(1 / 0.65, 1 / 0.65),
                     metadata={"unit": "um"})
    assert main(["run", str(tmp_path / "cells.tif"), "--n-boot", "4", "--quiet",
                 "--out", str(tmp_path / "out")]) == 0
    from napari_attnreg.core.results.result import AttentionResult

    result = AttentionResult.load(tmp_path / "out" / "cells.tif.attnreg.npz")
    assert result.spatial["scale"] == pytest.approx((0.65, 0.65))
    assert result.spatial["units"] == ("µm", "µm")
