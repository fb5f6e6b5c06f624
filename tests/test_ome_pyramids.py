"""OME-TIFF pyramids (bfconvert / QuPath / tifffile sub-IFDs): one level read for a run by its
OME axes (colour, grey, channels) and pixel size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

tifffile = pytest.importorskip("tifffile")
pytest.importorskip("zarr")
pytest.importorskip("dask")

SIZE = 2048


def _pixels(size: int, channels: int | None = None, rgb: bool = False) -> np.ndarray:
    """Textured blobs on a dark background; ``rgb``: uint8 colour, else uint16 channels."""
    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[:size, :size] / size
    blobs = sum(np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 0.004)
                for cy, cx in rng.random((12, 2)))
    base = blobs / blobs.max()
    if rgb:
        img = np.stack([base * 200, base * 80 + 30, base * 160], -1)
        return (img + rng.random(img.shape) * 40).astype(np.uint8)
    planes = [np.roll(base, 97 * c, axis=1) * (3000 + 500 * c) + rng.random(base.shape) * 300
              for c in range(channels or 1)]
    img = np.stack(planes) if channels else planes[0]
    return img.astype(np.uint16)


def write_pyramid(path: Path, img: np.ndarray, axes: str, levels: int = 3, size: float = 0.5,
                  unit: str = "µm", names: list[str] | None = None) -> Path:
    """An OME-TIFF pyramid as bfconvert writes one: level 0 with ``levels - 1`` sub-IFDs, each
    half the size of the one before, tiled 256²."""
    metadata = {"axes": axes, "PhysicalSizeX": size, "PhysicalSizeY": size,
                "PhysicalSizeXUnit": unit, "PhysicalSizeYUnit": unit}
    if names:
        metadata["Channel"] = {"Name": names}
    photometric = "rgb" if axes == "YXS" else "minisblack"
    step = (slice(None),) if axes.startswith("C") else ()
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(img, tile=(256, 256), subifds=levels - 1, photometric=photometric,
                  metadata=metadata)
        for k in range(1, levels):
            f = 2 ** k
            tif.write(img[(*step, slice(None, None, f), slice(None, None, f))].copy(),
                      tile=(256, 256), subfiletype=1, photometric=photometric)
    return path


def _level(path: Path, level: int) -> np.ndarray:
    return tifffile.imread(path, series=0, level=level)


@pytest.fixture(scope="module")
def rgb_pyramid(tmp_path_factory) -> Path:
    """2048² RGB, 0.5 µm per pixel, levels 1/2 and 1/4."""
    return write_pyramid(tmp_path_factory.mktemp("ome") / "tissue.ome.tif",
                         _pixels(SIZE, rgb=True), "YXS")


@pytest.fixture(scope="module")
def cyx_pyramid(tmp_path_factory) -> Path:
    """2048² fluorescence, three named uint16 channels, 500 nm per pixel (in nm)."""
    return write_pyramid(tmp_path_factory.mktemp("ome") / "cells.ome.tif",
                         _pixels(SIZE, channels=3), "CYX", size=500.0, unit="nm",
                         names=["DAPI", "GFP", "RFP"])


# -- one level for a run -----------------------------------------------------------------------

def test_a_level_is_read_by_its_ome_axes_one_channel_or_all(cyx_pyramid):
    from napari_attnreg.io.ometiff import open_ome_level

    level1 = _level(cyx_pyramid, 1)
    gfp = open_ome_level(cyx_pyramid, level=1, channel=1)
    assert gfp.shape == (1024, 1024) and gfp.channel_axis is None
    assert gfp.level == 1 and gfp.downsample == 2.0 and gfp.mpp == pytest.approx(1.0)
    np.testing.assert_array_equal(gfp.read(slice(100, 300), slice(7, 900)),
                                  level1[1, 100:300, 7:900])
    every = open_ome_level(cyx_pyramid, level=1)  # three channels: channels last
    np.testing.assert_array_equal(every.read(slice(0, 50), slice(0, 60)),
                                  np.moveaxis(level1[:, :50, :60], 0, -1))
    # the thumbnail (tissue masks, intensity ranges) is a coarser level of the same channel
    np.testing.assert_array_equal(gfp.overview(), _level(cyx_pyramid, 2)[1])
    # a resolution between levels: the level at least as fine, resampled
    coarse = open_ome_level(cyx_pyramid, mpp=1.5, channel=0)
    assert coarse.level == 1 and coarse.scale == pytest.approx(1.5)
    with pytest.raises(ValueError, match="no channel 3"):
        open_ome_level(cyx_pyramid, channel=3)
    with pytest.raises(ValueError, match="levels 0–2"):
        open_ome_level(cyx_pyramid, level=3)


def test_the_command_line_reads_a_level_of_a_fluorescence_pyramid_by_its_axes(tmp_path):
    # a CYX pyramid at --level was read as a slide's (H, W, colour) level: "3x256 px"
    from napari_attnreg.cli import main
    from napari_attnreg.core.results.result import AttentionResult

    path = write_pyramid(tmp_path / "cells.ome.tif", _pixels(1024, channels=3), "CYX")
    out = tmp_path / "out"
    assert main(["run", str(path), "--tiled", "--level", "2", "--out", str(out), "--n-boot",
                 "4", "--device", "cpu", "--quiet"]) == 0
    result = AttentionResult.load(next(out.glob("*.attnreg.npz")))
    md = result.metadata
    assert result.image_shape == (256, 256) and md["slide_level"] == 2
    assert result.spatial["scale"] == pytest.approx((2.0, 2.0))
    assert md["image_kind"] == "microscopy" and md["tissue_mask"] == "none"
