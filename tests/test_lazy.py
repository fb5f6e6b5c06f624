"""Large inputs read on demand: OME-/Big-TIFF and OME-Zarr tiled without loading them."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

pytest.importorskip("zarr")

from napari_attnreg import AttentionResult, regularize
from napari_attnreg.cli import main
from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.run.lazy import LazyImage, open_lazy
from napari_attnreg.testing.synthetic import TRAINING_SCALE, make_cell_image

QUIET = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def field():
    return make_cell_image(6, size=(400, 300), scale=TRAINING_SCALE, abnormal=True).image


@pytest.fixture(scope="module")
def ome_tiff(tmp_path_factory, field):
    path = tmp_path_factory.mktemp("lazy") / "field.ome.tif"
    tifffile.imwrite(path, field, tile=(128, 128), bigtiff=True, ome=True)
    return path


def test_open_lazy_reads_regions_without_the_whole_image(ome_tiff, field):
    image = open_lazy(ome_tiff)
    assert image.shape == (400, 300) and image.dtype == np.uint16 and image.channel_axis is None
    np.testing.assert_array_equal(image.read(slice(10, 50), slice(100, 228)), field[10:50, 100:228])


@QUIET
@pytest.mark.parametrize("method", ["normal", "patch"])
def test_a_lazy_tiled_run_reads_tile_by_tile_and_matches_the_in_memory_run(ome_tiff, field, method,
                                                                             monkeypatch):
    demo = load_backbone("demo")
    reads = []
    real = LazyImage.read
    monkeypatch.setattr(LazyImage, "read", lambda self, ys, xs: reads.append((ys, xs)) or
                        real(self, ys, xs))
    opts = {"n_boot": 10, "device": "cpu", "tiled": True, "tile_overlap": 16, "method": method}
    lazy = regularize(open_lazy(ome_tiff), demo, **opts)
    assert lazy.metadata["read_on_demand"] and lazy.image_shape == (400, 296)  # whole patches
    # one strided read for the statistics; every other read is one band of tile rows
    whole = [r for r in reads if (r[0].stop or 400) - (r[0].start or 0) > 128]
    assert len(whole) == 1 and whole[0][0].step == 1
    bands = [r for r in reads if r not in whole]
    assert all(r[0].stop - r[0].start == 128 and r[1] == slice(0, 296) for r in bands)
    if method == "normal":  # 4 rows of tiles, each read once
        assert len(bands) == 4
    eager = regularize(field[:, :296], demo, **opts)
    assert lazy.grid_shape == eager.grid_shape == (50, 37)
    np.testing.assert_allclose(lazy.attention, eager.attention, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(lazy.z, eager.z, atol=1e-3)


@QUIET
def test_ome_zarr_through_the_command_line(tmp_path, field):
    import zarr

    root = zarr.open_group(str(tmp_path / "field.zarr"), mode="w")
    arr = root.create_array("0", shape=(1, 1, 1, *field.shape), chunks=(1, 1, 1, 128, 128),
                            dtype=field.dtype)
    arr[0, 0, 0] = field
    root.attrs["multiscales"] = [{"version": "0.4", "datasets": [{"path": "0"}],
                                  "axes": [{"name": a} for a in "tczyx"]}]
    assert open_lazy(tmp_path / "field.zarr").shape == field.shape
    out = tmp_path / "out"
    assert main(["run", str(tmp_path), "--out", str(out), "--tiled", "--model", "demo",
                 "--n-boot", "4", "--device", "cpu", "--quiet"]) == 0
    res = AttentionResult.load(out / "field.zarr.attnreg.npz")
    assert res.metadata["read_on_demand"] and res.grid_shape == (50, 37)
    assert (out / "field.zarr.attnreg.png").is_file()


# ---- layouts and errors like the in-memory readers (issue #12) --------------------------------
def test_open_lazy_names_the_file_and_uses_the_plane_rules(tmp_path):
    bad = tmp_path / "bad.tif"
    bad.write_text("not a tiff")
    with pytest.raises(ValueError, match=f"{bad} is not a readable image"):
        open_lazy(bad)
    data = np.random.default_rng(0).integers(0, 255, (3, 64, 80)).astype(np.uint8)
    tifffile.imwrite(tmp_path / "x.tif", data)  # unlabelled: channels or planes?
    with pytest.raises(ValueError, match="x.tif.*ambiguous.*--channel-axis 0"):
        open_lazy(tmp_path / "x.tif")
    assert open_lazy(tmp_path / "x.tif", channel_axis=0).channel_axis == 0
    tifffile.imwrite(tmp_path / "c.ome.tif", data, ome=True, metadata={"axes": "CYX"})
    image = open_lazy(tmp_path / "c.ome.tif")
    assert image.shape == (64, 80) and image.read(slice(0, 4), slice(0, 4)).shape == (4, 4, 3)
    tifffile.imwrite(tmp_path / "z.ome.tif", data, ome=True, metadata={"axes": "ZYX"})
    with pytest.raises(ValueError, match="holds 3 planes.*split"):
        open_lazy(tmp_path / "z.ome.tif")
    tifffile.imwrite(tmp_path / "two.tif", data[..., :2].transpose(1, 2, 0).copy())
    assert open_lazy(tmp_path / "two.tif").channel_axis == -1  # (H, W, 2): two channels
