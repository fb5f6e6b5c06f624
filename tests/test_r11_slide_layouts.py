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
