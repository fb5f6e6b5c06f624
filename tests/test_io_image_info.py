"""What an image file says beyond its pixels (issue #17): the physical pixel size that the
figure's scale bar reads, the image kind that the off-domain check reads, and the napari
manifest's claim on DICOM files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile

from napari_attnreg.io.readers import ImageInfo, image_info, read_source


def test_an_ome_tiff_gives_its_pixel_size_and_is_microscopy(tmp_path):
    path = tmp_path / "cells.ome.tif"
    tifffile.imwrite(path, np.zeros((2, 16, 20), np.uint16), ome=True,
                     metadata={"axes": "ZYX", "PhysicalSizeX": 0.25, "PhysicalSizeY": 0.5,
                               "PhysicalSizeZ": 2.0})
    stack, info = read_source(path)
    assert stack.planes() == [(0,), (1,)]
    assert info == ImageInfo((0.5, 0.25), "µm", "microscopy", "OME metadata")
    assert image_info(path) == info  # the header alone, for images read on demand
    assert info.run_extra() == {"spatial": {"scale": [0.5, 0.25], "translate": [0.0, 0.0],
                                            "units": ["µm", "µm"]},
                                "image_kind": "microscopy", "image_kind_source": "OME metadata"}
    nm = tmp_path / "nm.ome.tif"
    tifffile.imwrite(nm, np.zeros((16, 20), np.uint16), ome=True,
                     metadata={"axes": "YX", "PhysicalSizeX": 80, "PhysicalSizeY": 80,
                               "PhysicalSizeXUnit": "nm", "PhysicalSizeYUnit": "nm"})
    assert read_source(nm)[1].pixel_size == (80.0, 80.0) and read_source(nm)[1].unit == "nm"


def test_a_tiff_without_an_ending_is_read_as_a_tiff_with_its_planes_and_pixel_size(tmp_path):
    """An OME-TIFF or ImageJ hyperstack saved without an ending (``IMG_0001``, a script's
    output) was read by imageio as its first page: planes, channels and size lost."""
    data = np.arange(2 * 3 * 16 * 20, dtype=np.uint16).reshape(2, 3, 16, 20)
    tifffile.imwrite(tmp_path / "cells", data, ome=True,
                     metadata={"axes": "ZCYX", "PhysicalSizeX": 0.25, "PhysicalSizeY": 0.25})
    stack, info = read_source(tmp_path / "cells")
    assert stack.shape == data.shape and stack.planes() == [(0,), (1,)]
    assert stack.channel_axis == 1
    assert info == ImageInfo((0.25, 0.25), "µm", "microscopy", "OME metadata")
    assert image_info(tmp_path / "cells") == info
    tifffile.imwrite(tmp_path / "hyper", data, imagej=True,
                     resolution=(4.0, 4.0), metadata={"axes": "ZCYX", "unit": "um"})
    stack, info = read_source(tmp_path / "hyper")
    assert stack.n_planes == 2 and stack.n_channels == 3 and info.pixel_size == (0.25, 0.25)


def test_files_that_state_nothing_give_no_size_and_no_kind(tmp_path):
    import imageio.v3 as iio

    tifffile.imwrite(tmp_path / "plain.tif", np.zeros((16, 20), np.uint16))
    iio.imwrite(tmp_path / "a.png", np.zeros((16, 20), np.uint8))
    no_size = tmp_path / "nosize.ome.tif"  # OME without PhysicalSize: microscopy, no scale bar
    tifffile.imwrite(no_size, np.zeros((16, 20), np.uint16), ome=True, metadata={"axes": "YX"})
    for name in ("plain.tif", "a.png"):
        assert read_source(tmp_path / name)[1] == ImageInfo()
        assert read_source(tmp_path / name)[1].run_extra() == {}
    assert read_source(no_size)[1] == ImageInfo(None, None, "microscopy", "OME metadata")
    assert image_info(tmp_path / "missing.tif") == ImageInfo()


def test_an_ome_zarr_gives_its_pixel_size(tmp_path):
    zarr = pytest.importorskip("zarr")
    path = tmp_path / "img.zarr"
    group = zarr.open_group(str(path), mode="w")
    group.create_array("0", shape=(16, 20), dtype="uint16")
    axes = [{"name": "y", "type": "space", "unit": "micrometer"},
            {"name": "x", "type": "space", "unit": "micrometer"}]
    group.attrs["ome"] = {"version": "0.5", "multiscales": [{
        "axes": axes, "datasets": [{"path": "0", "coordinateTransformations": [
            {"type": "scale", "scale": [0.4, 0.3]}]}]}]}
    assert image_info(path) == ImageInfo((0.4, 0.3), "µm", "microscopy", "OME metadata")


def test_the_manifest_offers_our_reader_for_dicom_files_and_folders():
    """npe2 has no reader priority: the manifest can only claim the patterns (napari then
    asks, or uses the analyst's saved preference; see the README)."""
    npe2 = pytest.importorskip("npe2")
    import napari_attnreg

    manifest = npe2.PluginManifest.from_file(Path(napari_attnreg.__file__).parent / "napari.yaml")
    (reader,) = manifest.contributions.readers
    assert {"*.dcm", "*.dicom"} <= set(reader.filename_patterns) and reader.accepts_directories
    manager = npe2.PluginManager()
    manager.register(manifest)
    for path in ("/data/ct/IM0001.dcm", "/data/ct/IM0001.DCM", "/data/x.dicom"):
        assert [r.command for r in manager.iter_compatible_readers([path])] == [reader.command]


def test_a_napari_layer_from_our_reader_states_what_the_command_line_reads(tmp_path):
    """The hook for napari/notebook: the layer's metadata gives the same ImageInfo."""
    from napari_attnreg.io.ometiff import read_ome_tiff

    path = tmp_path / "cells.ome.tif"
    tifffile.imwrite(path, np.zeros((16, 20), np.uint16), ome=True,
                     metadata={"axes": "YX", "PhysicalSizeX": 0.25, "PhysicalSizeY": 0.5})
    (_, kwargs), = read_ome_tiff(path)
    assert ImageInfo.from_layer_metadata(kwargs["metadata"]) == read_source(path)[1]
    assert ImageInfo.from_layer_metadata({}) == ImageInfo()
    pytest.importorskip("pydicom")
    from test_io_readers import write_ct_slice

    from napari_attnreg.io.dicom import read_dicom

    (tmp_path / "ct").mkdir()
    for k in range(2):
        write_ct_slice(tmp_path / "ct" / f"s{k}.dcm", 2.5 * k, k + 1, np.ones((8, 6)))
    (_, kwargs), = read_dicom(tmp_path / "ct")
    info = ImageInfo.from_layer_metadata(kwargs["metadata"])
    assert info == read_source(tmp_path / "ct")[1]
    assert info == ImageInfo((0.7, 0.5), "mm", "radiology", "DICOM Modality CT",
                             window=(-160.0, 240.0), states_window=True,
                             windows=((-160.0, 240.0, ""),))
