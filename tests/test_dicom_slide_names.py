"""Two DICOM whole-slide images in one folder get outputs that say which slide is which.

Before, a batch over a folder holding two slides (both series 1, as scanners number them)
wrote ``series_1`` and ``series_1_2``, and summary.csv's source (and the resume records)
named the folder for both: nothing told slide A's result from slide B's. A slide's outputs
are now named after its barcode (ContainerIdentifier) or, without one, a level's file.
"""

from __future__ import annotations

import pytest

pydicom = pytest.importorskip("pydicom", minversion="3.0")
pytest.importorskip("tiffslide")

from pydicom.uid import generate_uid  # noqa: E402
from test_dicom_wsi import _pixels, write_level  # noqa: E402

from napari_attnreg.core.results.result import AttentionResult  # noqa: E402


def test_two_slides_in_one_folder_are_named_by_barcode_or_file(tmp_path):
    from napari_attnreg.cli import main

    folder = tmp_path / "scanner export"
    folder.mkdir()
    for name, (h, w) in (("A", (520, 700)), ("B", (400, 610))):
        series, img = generate_uid(), _pixels(h, w, seed=len(name) + h)
        write_level(folder / f"{name}_0.dcm", img, 0.0005, series=series, number=1)
        write_level(folder / f"{name}_1.dcm", img[::2, ::2].copy(), 0.001, series=series,
                    number=2)
    for f in ("A_0.dcm", "A_1.dcm"):  # slide A states its barcode, B does not
        ds = pydicom.dcmread(folder / f)
        ds.ContainerIdentifier = "S24/0815 A1"
        ds.save_as(folder / f)
    out = tmp_path / "out"
    assert main(["run", str(folder), "--tiled", "--level", "1", "--out", str(out),
                 "--n-boot", "4", "--device", "cpu", "--quiet"]) == 0
    a = AttentionResult.load(out / "slide_S24_0815_A1.attnreg.npz")
    b = AttentionResult.load(out / "slide_B_0.attnreg.npz")
    # each name holds its own slide: level 1 of A is 260x350, of B 200x305 (cropped to 8s)
    assert a.image_shape == (256, 344) and b.image_shape == (200, 304)
