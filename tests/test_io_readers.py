"""DICOM and OME-TIFF readers: volumes with their physical spacing, window and channels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from napari_attnreg.io.dicom import dicom_files, read_dicom
from napari_attnreg.io.ometiff import is_ome_tiff, read_ome_tiff

pydicom = pytest.importorskip("pydicom")


def write_ct_slice(path, z_mm: float, instance: int, pixels: np.ndarray, *, series_uid="1.2.3.4",
                   slope=1.0, intercept=-1024.0, window=(40.0, 400.0), modality="CT"):
    """A minimal single-frame CT slice (uint16 stored values) written with pydicom."""
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.2"  # CT Image Storage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Modality, ds.SeriesInstanceUID, ds.StudyInstanceUID = modality, series_uid, "1.2.3"
    ds.SeriesDescription, ds.SeriesNumber, ds.InstanceNumber = "head axial", 2, instance
    ds.PatientName = "Doe^Jane"
    ds.ImagePositionPatient = [-100.0, -120.0, z_mm]
    ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    ds.PixelSpacing = [0.7, 0.5]  # row spacing (y), column spacing (x)
    ds.SliceThickness = 9.9  # deliberately wrong: positions win
    ds.RescaleSlope, ds.RescaleIntercept = slope, intercept
    ds.WindowCenter, ds.WindowWidth = window
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.Rows, ds.Columns = pixels.shape
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
    ds.PixelData = pixels.astype(np.uint16).tobytes()
    ds.save_as(path, enforce_file_format=True)


@pytest.fixture
def ct_folder(tmp_path):
    """Four slices 2.5 mm apart, written out of order; slice k holds the value 1000 + 10 k."""
    folder = tmp_path / "ct"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for k, file_index in enumerate([3, 0, 2, 1]):
        pixels = np.full((6, 5), 1000 + 10 * k, dtype=np.uint16)
        pixels[0, 0] = rng.integers(0, 50)
        write_ct_slice(folder / f"img{file_index}.dcm", z_mm=-30.0 + 2.5 * k,
                       instance=10 - k, pixels=pixels)
    (folder / "notes.txt").write_text("not DICOM")
    return folder


def test_dicom_folder_is_one_volume_in_position_order_with_spacing_and_window(ct_folder):
    (volume, kwargs), = read_dicom(ct_folder)
    assert volume.shape == (4, 6, 5)
    # rescaled (stored − 1024), slices by position (not file name, not the reversed InstanceNumber)
    np.testing.assert_array_equal(volume[:, 3, 3], [1000 - 1024 + 10 * k for k in range(4)])
    assert volume.dtype.kind == "i" and volume.min() < 0
    assert kwargs["scale"] == pytest.approx((2.5, 0.7, 0.5))
    assert kwargs["contrast_limits"] == pytest.approx((40 - 200, 40 + 200))
    assert kwargs["name"] == "head axial" and kwargs["colormap"] == "gray"
    info = kwargs["metadata"]["dicom"]
    assert info["modality"] == "CT" and info["series_instance_uid"] == "1.2.3.4"
    assert info["files"] == 4 and kwargs["metadata"]["source_path"] == str(ct_folder)
    assert "Doe" not in repr(kwargs["metadata"])  # no patient identifiers


def test_dicom_non_integer_slope_gives_float_values(tmp_path):
    write_ct_slice(tmp_path / "a.dcm", 0.0, 1, np.array([[0, 10], [20, 30]]), slope=0.5,
                   intercept=-3.0)
    (image, kwargs), = read_dicom(tmp_path / "a.dcm")
    assert image.shape == (2, 2) and image.dtype == np.float32
    np.testing.assert_allclose(image, [[-3, 2], [7, 12]])
    assert kwargs["scale"] == pytest.approx((0.7, 0.5))


def test_dicom_folder_with_two_series_gives_two_layers(tmp_path):
    for k in range(3):
        write_ct_slice(tmp_path / f"a{k}.dcm", 2.0 * k, k, np.full((4, 4), k), series_uid="1.1")
    write_ct_slice(tmp_path / "b.dcm", 0.0, 1, np.full((4, 4), 7), series_uid="1.2")
    layers = read_dicom(tmp_path)
    assert sorted(data.shape for data, _ in layers) == [(3, 4, 4), (4, 4)]


def test_dicom_duplicate_positions_are_refused(tmp_path):
    for k in range(2):
        write_ct_slice(tmp_path / f"a{k}.dcm", 5.0, k, np.zeros((4, 4)))
    with pytest.raises(ValueError, match="share a position"):
        read_dicom(tmp_path)


def test_dicom_reader_ignores_folders_without_dicom(tmp_path):
    (tmp_path / "x.txt").write_text("hello")
    assert dicom_files(tmp_path) == []
    with pytest.raises(ValueError, match="No DICOM files"):
        read_dicom(tmp_path)


def test_missing_pydicom_names_the_extra(monkeypatch, ct_folder):
    import sys

    monkeypatch.setitem(sys.modules, "pydicom", None)  # import pydicom now raises ImportError
    with pytest.raises(ImportError, match=r"napari-attnreg\[dicom\]"):
        read_dicom(ct_folder)


def _write_ome(path, data, axes, tile=None, **metadata):
    import tifffile

    tifffile.imwrite(path, data, ome=True, tile=tile, metadata={"axes": axes, **metadata})


def test_ome_tiff_scale_units_and_channel_axis(tmp_path):
    path = tmp_path / "cells.ome.tif"
    data = np.arange(3 * 2 * 8 * 10, dtype=np.uint16).reshape(3, 2, 8, 10)
    _write_ome(path, data, "ZCYX", PhysicalSizeX=0.25, PhysicalSizeY=0.5, PhysicalSizeZ=2.0,
               Channel={"Name": ["DAPI", "GFP"]})
    assert is_ome_tiff(path)
    (read, kwargs), = read_ome_tiff(path)
    np.testing.assert_array_equal(read, data)
    assert kwargs["channel_axis"] == 1
    assert kwargs["scale"] == pytest.approx((2.0, 0.5, 0.25))
    assert kwargs["axis_labels"] == ("z", "y", "x") and kwargs["units"] == ("µm",) * 3
    assert kwargs["name"] == ["cells · DAPI", "cells · GFP"]
    assert kwargs["metadata"]["ome"]["axes"] == "ZCYX"


def test_ome_tiff_rgb_and_single_channel(tmp_path):
    rgb = tmp_path / "slide.ome.tiff"
    _write_ome(rgb, np.zeros((12, 16, 3), np.uint8), "YXS", PhysicalSizeX=0.5,
               PhysicalSizeY=0.5, PhysicalSizeXUnit="nm", PhysicalSizeYUnit="nm")
    (data, kwargs), = read_ome_tiff(rgb)
    assert kwargs["rgb"] and data.shape == (12, 16, 3) and "channel_axis" not in kwargs
    assert kwargs["scale"] == pytest.approx((0.5, 0.5)) and kwargs["units"] == ("nm", "nm")
    single = tmp_path / "one.ome.tif"
    _write_ome(single, np.ones((1, 9, 7), np.float32), "CYX")
    (data, kwargs), = read_ome_tiff(single)
    assert data.shape == (9, 7) and kwargs["scale"] == (1.0, 1.0) and "units" not in kwargs


def test_plain_tiff_is_not_ome(tmp_path):
    import tifffile

    plain = tmp_path / "plain.tif"
    tifffile.imwrite(plain, np.zeros((4, 4), np.uint8))
    assert not is_ome_tiff(plain)
    fake = tmp_path / "fake.ome.tif"
    tifffile.imwrite(fake, np.zeros((4, 4), np.uint8), ome=False)  # named OME, is not
    with pytest.raises(ValueError, match="no OME-XML"):
        read_ome_tiff(fake)


def test_multi_frame_dicom_is_one_volume(tmp_path):
    path = tmp_path / "mf.dcm"
    frames = np.stack([np.full((4, 5), 100 * k, np.uint16) for k in range(3)])
    write_ct_slice(path, 0.0, 1, frames[0], intercept=0.0)
    ds = pydicom.dcmread(path)
    ds.NumberOfFrames, ds.SpacingBetweenSlices = 3, 1.5
    ds.PixelData = frames.tobytes()
    ds.save_as(path, enforce_file_format=True)
    (volume, kwargs), = read_dicom(path)
    np.testing.assert_array_equal(volume, frames)
    assert kwargs["scale"] == pytest.approx((1.5, 0.7, 0.5))


def test_reader_hook_check_is_cheap_and_declines_other_folders(tmp_path, ct_folder):
    from napari_attnreg.io.dicom import looks_like_dicom

    assert looks_like_dicom(ct_folder) and looks_like_dicom(next(ct_folder.glob("*.dcm")))
    store = tmp_path / "tiles"
    store.mkdir()
    for i in range(100):
        (store / f"0.{i}").write_bytes(b"\0" * 200)
    assert not looks_like_dicom(store)
    zarr_store = tmp_path / "image.zarr"
    zarr_store.mkdir()
    write_ct_slice(zarr_store / "a.dcm", 0.0, 1, np.zeros((2, 2)))
    assert not looks_like_dicom(zarr_store)  # zarr stores belong to the zarr readers
    assert not looks_like_dicom(tmp_path / "missing.dcm")


def test_large_ome_tiff_is_read_on_demand(tmp_path):
    pytest.importorskip("dask")
    pytest.importorskip("zarr")
    import dask.array as da

    path = tmp_path / "big.ome.tif"
    data = np.arange(2 * 3 * 64 * 64, dtype=np.uint16).reshape(2, 3, 64, 64)
    _write_ome(path, data, "ZCYX", PhysicalSizeX=0.5, PhysicalSizeY=0.5, tile=(32, 32))
    (lazy, kwargs), = read_ome_tiff(path, lazy_bytes=0)
    assert isinstance(lazy, da.Array) and kwargs["channel_axis"] == 1
    np.testing.assert_array_equal(lazy.compute(), data)


# ---- issue #18: readers that never return wrong data silently --------------------------------
def test_dicom_uint32_pixels_with_an_intercept_do_not_wrap(tmp_path):
    path = tmp_path / "u32.dcm"
    write_ct_slice(path, 0.0, 1, np.zeros((2, 3), np.uint16), intercept=-1000.0)
    ds = pydicom.dcmread(path)
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 32, 32, 31
    ds.PixelData = np.array([[0, 1, 2], [3, 4, 3_000_000_000]], np.uint32).tobytes()
    ds.save_as(path, enforce_file_format=True)
    (volume, _), = read_dicom(path)
    assert int(volume.max()) == 2_999_999_000 and int(volume.min()) == -1000


def _multi_frame(path, frames, series_uid="1.2.3.4", instance=1):
    write_ct_slice(path, 0.0, instance, frames[0], intercept=0.0, series_uid=series_uid)
    ds = pydicom.dcmread(path)
    ds.NumberOfFrames, ds.SpacingBetweenSlices = len(frames), 1.5
    ds.PixelData = np.ascontiguousarray(frames).tobytes()
    ds.save_as(path, enforce_file_format=True)


def test_every_multi_frame_file_of_a_series_is_read(tmp_path):
    first = np.stack([np.full((4, 5), 100 * k, np.uint16) for k in range(3)])
    second = first + 7
    _multi_frame(tmp_path / "a.dcm", first)
    _multi_frame(tmp_path / "b.dcm", second, instance=2)
    layers = read_dicom(tmp_path)
    assert len(layers) == 2
    np.testing.assert_array_equal(layers[0][0], first)
    np.testing.assert_array_equal(layers[1][0], second)
    assert layers[0][1]["name"] != layers[1][1]["name"]


def test_axial_and_sagittal_slices_of_one_series_are_not_stacked(tmp_path):
    for k in range(2):
        write_ct_slice(tmp_path / f"ax{k}.dcm", 2.0 * k, k + 1, np.full((6, 5), k, np.uint16))
    for k in range(3):
        write_ct_slice(tmp_path / f"sag{k}.dcm", 0.0, 10 + k, np.full((6, 5), 50 + k, np.uint16))
        ds = pydicom.dcmread(tmp_path / f"sag{k}.dcm")
        ds.ImageOrientationPatient = [0, 1, 0, 0, 0, -1]
        ds.ImagePositionPatient = [-10.0 + 3.0 * k, -120.0, 0.0]
        ds.save_as(tmp_path / f"sag{k}.dcm", enforce_file_format=True)
    layers = read_dicom(tmp_path)
    shapes = sorted(volume.shape for volume, _ in layers)
    assert shapes == [(2, 6, 5), (3, 6, 5)]
    names = {kwargs["name"] for _, kwargs in layers}
    assert any("axial" in n for n in names) and any("sagittal" in n for n in names)
    sagittal = next(kw for v, kw in layers if v.shape[0] == 3)
    assert sagittal["scale"][0] == pytest.approx(3.0)


def test_ome_physical_sizes_that_cannot_be_sizes_become_scale_one_with_a_warning(tmp_path):
    import tifffile

    for bad in ("NaN", "INF", "-0.5", "1e300", "0"):
        path = tmp_path / f"s{bad}.ome.tif"
        tifffile.imwrite(path, np.zeros((2, 8, 8), np.uint8), ome=True,
                         metadata={"axes": "ZYX", "PhysicalSizeX": 0.25})
        with tifffile.TiffFile(path) as tif:  # the writer refuses such values: edit the XML
            xml = tif.ome_metadata
        xml = xml.replace('PhysicalSizeX="0.25"', f'PhysicalSizeX="0.25" PhysicalSizeY="{bad}"')
        tifffile.tiffcomment(path, xml.encode())
        with pytest.warns(UserWarning, match="physical size of axis Y"):
            (_, kwargs), = read_ome_tiff(path)
        assert kwargs["scale"][-2:] == (1.0, 0.25)


def test_ome_tiffdata_never_pulls_pixels_from_another_file(tmp_path):
    import tifffile

    secret = tmp_path / "secret.ome.tif"
    tifffile.imwrite(secret, np.full((8, 8), 77, np.uint8), ome=True)
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "a.ome.tif"
    tifffile.imwrite(path, np.zeros((2, 8, 8), np.uint8), ome=True, metadata={"axes": "ZYX"})
    with tifffile.TiffFile(path) as tif:
        xml = tif.ome_metadata
    start = xml.index("<TiffData")
    end = xml.index("/>", start) + 2
    xml = xml[:start] + ('<TiffData IFD="0" PlaneCount="1" FirstZ="0"/>'
                         '<TiffData FirstZ="1" IFD="0" PlaneCount="1">'
                         '<UUID FileName="../secret.ome.tif">urn:uuid:0</UUID></TiffData>'
                         ) + xml[end:]
    tifffile.tiffcomment(path, xml.encode())
    try:
        (data, _), = read_ome_tiff(path)
    except ValueError as err:  # refusing is fine too; the other file's pixels are not
        assert str(path) in str(err)
        return
    assert not np.any(np.asarray(data) == 77)


def test_dicom_layers_keep_the_uids_and_files_of_their_slices(ct_folder):
    (volume, kwargs), = read_dicom(ct_folder)
    meta = kwargs["metadata"]
    assert meta["source_path"] == str(ct_folder)
    files = meta["dicom"]["source_files"]
    assert [f.rsplit("/", 1)[-1] for f in files] == ["img3.dcm", "img0.dcm", "img2.dcm", "img1.dcm"]
    uids = meta["dicom"]["sop_instance_uids"]
    assert uids == [str(pydicom.dcmread(f).SOPInstanceUID) for f in files] and len(set(uids)) == 4
    assert "Doe" not in str(meta)  # no patient identifiers


# ---- DICOM files in a batch: read as napari reads them (issue #16) ----------------------------
def test_read_stack_reads_a_dicom_file_as_the_napari_reader_does(tmp_path, monkeypatch):
    import sys

    from napari_attnreg.io.readers import read_stack

    frames = np.stack([np.full((4, 5), 100 * k, np.uint16) for k in range(3)])
    frames[:, 0, 0] = 7
    _multi_frame(tmp_path / "mf.dcm", frames)
    stack = read_stack(tmp_path / "mf.dcm")
    (volume, _), = read_dicom(tmp_path / "mf.dcm")
    assert stack.planes() == [(0,), (1,), (2,)] and stack.channel_axis is None
    np.testing.assert_array_equal(stack.read((2,))[0], volume[2])
    write_ct_slice(tmp_path / "one.dcm", 0.0, 1, np.arange(30).reshape(6, 5))
    single = read_stack(tmp_path / "one.dcm")
    assert single.planes() == [()]
    assert single.read(())[0].min() == -1024  # rescaled, as napari shows it
    monkeypatch.setitem(sys.modules, "pydicom", None)
    with pytest.raises(ValueError, match=r"one\.dcm.*napari-attnreg\[dicom\]"):
        read_stack(tmp_path / "one.dcm")  # the file's failure, not the end of a batch


def _ct_series(folder, n=3, names=None, size=64):
    """``n`` CT slices 2.5 mm apart under shuffled names; slice k has a bright square at row
    8 + 12 k, so the order of the planes shows."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    names = names or [f"{name}.dcm" for name in rng.permutation([f"x{k:02d}" for k in range(n)])]
    for k, name in enumerate(names):
        pixels = (1000 + 200 * rng.random((size, size))).astype(np.uint16)
        pixels[8 + 12 * k:16 + 12 * k, 20:30] += 800
        write_ct_slice(folder / name, z_mm=-40.0 + 2.5 * k, instance=k + 1, pixels=pixels)
    return folder


def test_a_folder_of_dicom_slices_is_one_series_read_once(tmp_path, monkeypatch):
    """Issue #17: one input, slices in position order with the mm spacing and HU, every file
    read once (not the folder once per file), outputs that sort as the slices lie."""
    import csv

    from napari_attnreg.batch.items import collect_inputs
    from napari_attnreg.cli import main
    from napari_attnreg.core.results.result import AttentionResult
    from napari_attnreg.io.readers import read_source

    folder = _ct_series(tmp_path / "ct", n=3)
    (folder / "notes.txt").write_text("not DICOM")
    (item,) = collect_inputs([folder])
    assert item.source == folder.resolve() and len(item.files) == 3
    stack, info = read_source(item.source, files=item.files)
    assert stack.planes() == [(0,), (1,), (2,)]
    rows = [int(np.flatnonzero(stack.read((k,))[0][:, 25] > 500)[0]) for k in range(3)]
    assert rows == [8, 20, 32]  # by ImagePositionPatient, whatever the file names
    assert stack.read((0,))[0].min() < 0  # Hounsfield units: stored − 1024
    assert info.pixel_size == (0.7, 0.5) and info.unit == "mm"
    assert info.kind == "radiology" and info.kind_source == "DICOM Modality CT"

    reads = []
    real = pydicom.dcmread

    def counting(path, *args, **kwargs):
        # header only: stopped before the pixels, or their value deferred (never read)
        header_only = kwargs.get("stop_before_pixels") or kwargs.get("defer_size") is not None
        reads.append((Path(path).name, bool(header_only)))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(pydicom, "dcmread", counting)
    out = tmp_path / "out"
    assert main(["run", str(folder), "--out", str(out), "--model", "demo",
                 "--n-boot", "4", "--device", "cpu", "--quiet"]) == 0
    # per file: its header once to find the series, then header and pixels once
    names = sorted(p.name for p in folder.glob("*.dcm"))
    assert sorted(reads) == sorted([(n, True) for n in names] + [(n, False) for n in names])
    with open(out / "summary.csv", newline="") as fh:
        summary = list(csv.DictReader(fh))
    assert [(r["plane"], r["status"]) for r in summary] == [("0", "done"), ("1", "done"),
                                                           ("2", "done")]
    assert sorted(p.name for p in (out / "ct").glob("*.npz")) == [
        "plane_0000.attnreg.npz", "plane_0001.attnreg.npz", "plane_0002.attnreg.npz"]
    result = AttentionResult.load(out / "ct" / "plane_0002.attnreg.npz")
    assert result.spatial == {"scale": (0.7, 0.5), "translate": (0.0, 0.0), "units": ("mm", "mm")}
    assert result.metadata["image_kind"] == "radiology"
    assert "off_domain" in [d.code for d in result.diagnostics]  # the demo model is no CT model
    # the command line's result opens in napari in millimetres, over the slice's extent
    from napari_attnreg._napari.io import read_result_layers

    extent = (result.image_shape[0] * 0.7, result.image_shape[1] * 0.5)
    for data, attrs, kind in read_result_layers(str(out / "ct" / "plane_0002.attnreg.npz")):
        assert tuple(attrs["units"])[-2:] == ("mm", "mm")
        if kind == "shapes":  # the outline's rings: their corners lie on the slice
            corners = [np.multiply(ring, tuple(attrs["scale"])[-2:]) for ring in data]
            assert all(c.min() >= 0 and (c.max(0) <= np.add(extent, 1e-6)).all()
                       for c in corners)
            continue
        shown = np.multiply(np.shape(data)[-2:], tuple(attrs["scale"])[-2:])
        assert tuple(shown) == pytest.approx(extent)


def test_dicom_files_without_an_ending_are_found_by_their_marker(tmp_path):
    from napari_attnreg.batch.items import collect_inputs

    folder = _ct_series(tmp_path / "ct", n=2, names=["IM0002", "1.2.840.99.7"])
    (folder / "README").write_text("not DICOM")
    (item,) = collect_inputs([folder])
    assert sorted(p.name for p in item.files) == ["1.2.840.99.7", "IM0002"]
    # a DICOM file named on its own is an input of its own, as it always was
    (alone,) = collect_inputs([folder / "IM0002"])
    assert alone.files == () and alone.source.name == "IM0002"


def test_a_folder_of_x_rays_and_a_ct_with_a_localizer_give_one_input_per_volume(tmp_path):
    """Grouped by their headers: a folder of single-image series (chest X-rays) is one input
    per file, as it always was; a localizer beside the axial slices is an input of its own;
    two slice series in one folder are folder/series_N."""
    from napari_attnreg.batch.items import collect_inputs

    xrays = tmp_path / "xrays"
    xrays.mkdir()
    for k, shape in enumerate([(40, 30), (50, 40), (40, 30)]):
        write_ct_slice(xrays / f"cxr{k}.dcm", 0.0, 1, np.ones(shape), series_uid=f"1.{k}",
                       modality="DX")
    items = collect_inputs([xrays])
    assert [(str(i.relative), i.files) for i in items] == [
        ("cxr0.dcm", ()), ("cxr1.dcm", ()), ("cxr2.dcm", ())]
    ct = _ct_series(tmp_path / "ct", n=3)
    write_ct_slice(ct / "scout.dcm", 0.0, 9, np.ones((64, 64)))
    from pydicom import dcmread

    scout = dcmread(ct / "scout.dcm")
    scout.ImageOrientationPatient = [0, 1, 0, 0, 0, -1]  # sagittal: not one of the slices
    scout.save_as(ct / "scout.dcm")
    items = {str(i.relative): len(i.files) for i in collect_inputs([ct])}
    assert items == {"ct": 3, "ct/scout.dcm": 0}  # outputs ct/plane_000k and ct/scout.dcm.*
    for k in range(2):  # a second series of slices in the same folder
        write_ct_slice(ct / f"b{k}.dcm", 5.0 * k, k + 1, np.ones((64, 64)), series_uid="7.7")
    items = {str(i.relative): len(i.files) for i in collect_inputs([ct])}
    # inputs of one folder are named within it, as files are
    assert items == {"series_2_axial_64x64": 3, "series_2": 2, "scout.dcm": 0}


def test_a_folder_of_several_series_says_so(tmp_path):
    from napari_attnreg.io.readers import read_source

    folder = _ct_series(tmp_path / "ct", n=2)
    write_ct_slice(folder / "other.dcm", 0.0, 1, np.ones((64, 64)), series_uid="9.9")
    with pytest.raises(ValueError, match="holds 2 DICOM series.*folder of its own"):
        read_source(folder)


# ---- round 17: the image analysed is the image a radiologist sees ---------------------------
def _monochrome1(path, pixels, *, bits_stored=12, window=(1000.0, 800.0), intercept=0.0):
    """A radiograph stored MONOCHROME1 (the lowest value is white), as CR/DX files are."""
    write_ct_slice(path, 0.0, 1, pixels, intercept=intercept, window=window, modality="CR")
    ds = pydicom.dcmread(path)
    ds.PhotometricInterpretation = "MONOCHROME1"
    ds.BitsStored, ds.HighBit = bits_stored, bits_stored - 1
    ds.save_as(path, enforce_file_format=True)


def test_monochrome1_is_read_the_right_way_round_for_napari_the_api_and_the_cli(tmp_path):
    from napari_attnreg.io.readers import read_source

    stored = np.array([[0, 100, 4095], [4000, 2000, 50]], np.uint16)  # 0 is white here
    path = tmp_path / "chest.dcm"
    _monochrome1(path, stored)
    (volume, kwargs), = read_dicom(path)
    # bright is dense: the values are turned round within the 12 bits, not shown inverted
    # by a colormap while the run analyses the negative
    np.testing.assert_array_equal(volume, 4095 - stored.astype(np.int64))
    assert kwargs["colormap"] == "gray" and kwargs["metadata"]["dicom"]["inverted"]
    # the stored window (centre 1000, width 800: stored 600..1400) turned round with them
    assert kwargs["contrast_limits"] == pytest.approx((4095 - 1400, 4095 - 600))
    stack, _ = read_source(path)  # what the command line and regularize(path) analyse
    np.testing.assert_array_equal(np.asarray(stack.data), volume)


def test_monochrome1_with_a_rescale_is_turned_round_in_the_modality_units(tmp_path):
    stored = np.array([[0, 10], [20, 255]], np.uint16)
    path = tmp_path / "dx.dcm"
    _monochrome1(path, stored, bits_stored=8, intercept=-100.0, window=(0.0, 100.0))
    (volume, kwargs), = read_dicom(path)
    np.testing.assert_array_equal(volume, (255 - stored.astype(np.int64)) - 100)
    # stored window -50..50 in units -100..155: turned round to 155-100-50 .. 155-100+50
    assert kwargs["contrast_limits"] == pytest.approx((5.0, 105.0))


def test_a_compressed_dicom_without_its_decoder_says_what_to_install(tmp_path):
    import importlib.util

    from pydicom.encaps import encapsulate
    from pydicom.uid import JPEGLosslessSV1

    if any(importlib.util.find_spec(m) for m in ("pylibjpeg", "gdcm")):
        pytest.skip("a JPEG Lossless decoder is installed here")
    path = tmp_path / "ct_jpeg_lossless.dcm"
    write_ct_slice(path, 0.0, 1, np.zeros((8, 8), np.uint16))
    ds = pydicom.dcmread(path)
    ds.file_meta.TransferSyntaxUID = JPEGLosslessSV1
    ds.PixelData = encapsulate([b"\xff\xd8\xff\xc3" + b"\0" * 32 + b"\xff\xd9"])
    ds["PixelData"].VR = "OB"
    ds.save_as(path, enforce_file_format=True)
    with pytest.raises(ValueError) as caught:
        read_dicom(path)
    message = str(caught.value)
    assert "compressed as JPEG Lossless" in message and "pip install pylibjpeg" in message
    assert "\n" not in message  # one line: a batch's summary row and its terminal line


def test_a_palette_colour_dicom_is_read_in_its_colours_not_as_grey_indices(tmp_path):
    from pydicom.dataelem import DataElement

    from napari_attnreg.io.readers import read_source

    path = tmp_path / "us.dcm"
    index = np.array([[0, 1, 2], [2, 1, 0]], np.uint8)
    write_ct_slice(path, 0.0, 1, np.zeros((2, 3), np.uint16), intercept=0.0, modality="US")
    ds = pydicom.dcmread(path)
    ds.PhotometricInterpretation = "PALETTE COLOR"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 8, 8, 7
    ds.PixelData = index.tobytes()
    table = {"Red": [65535, 0, 0], "Green": [0, 65535, 0], "Blue": [0, 0, 65535]}
    for n, colour in enumerate(("Red", "Green", "Blue")):
        ds.add(DataElement(0x00281101 + n, "US", [3, 0, 16]))
        ds.add(DataElement(0x00281201 + n, "OW",
                           np.array(table[colour], "<u2").tobytes()))
    ds.save_as(path, enforce_file_format=True)
    (volume, kwargs), = read_dicom(path)
    assert kwargs["rgb"] and volume.shape == (2, 3, 3) and volume.dtype == np.uint8
    np.testing.assert_array_equal(volume[0, 0], [255, 0, 0])  # index 0: red
    np.testing.assert_array_equal(volume[0, 2], [0, 0, 255])  # index 2: blue
    stack, _ = read_source(path)
    assert stack.rgb and stack.plane_shape == (2, 3)


def test_an_enhanced_ct_is_rescaled_and_windowed_from_its_functional_groups(tmp_path):
    """An enhanced (multi-frame) CT states its rescale and window per frame or shared, in
    functional groups, not at the top level: its values came out 1024 off Hounsfield units
    and its window was lost."""
    from pydicom.dataset import Dataset
    from pydicom.sequence import Sequence

    path = tmp_path / "enhanced_ct.dcm"
    frames = np.stack([np.full((4, 5), 1000 + 100 * k, np.uint16) for k in range(3)])
    _multi_frame(path, frames)
    ds = pydicom.dcmread(path)
    for key in ("RescaleSlope", "RescaleIntercept", "WindowCenter", "WindowWidth"):
        del ds[key]
    transform, window = Dataset(), Dataset()
    transform.RescaleSlope, transform.RescaleIntercept = 1.0, -1024.0
    window.WindowCenter, window.WindowWidth = 40.0, 400.0
    shared = Dataset()
    shared.PixelValueTransformationSequence = Sequence([transform])
    frame = Dataset()
    frame.FrameVOILUTSequence = Sequence([window])
    ds.SharedFunctionalGroupsSequence = Sequence([shared])
    ds.PerFrameFunctionalGroupsSequence = Sequence([frame] * 3)
    ds.save_as(path, enforce_file_format=True)
    (volume, kwargs), = read_dicom(path)
    np.testing.assert_array_equal(volume, frames.astype(np.int64) - 1024)
    assert kwargs["contrast_limits"] == pytest.approx((-160.0, 240.0))


def test_planar_rgb_and_palette_tiffs_are_read_in_the_colours_their_tags_state(tmp_path):
    """A scanner's planar RGB TIFF (colours stored as planes) was refused as "3 channels or 3
    planes?", several pages of one became six grey planes, and a palette TIFF was analysed
    as its colour indices. (A (3, H, W) array that tifffile wrote with its shape follows the
    array's rules: test_batch's ambiguity test.)"""
    import tifffile

    from napari_attnreg.cli import main
    from napari_attnreg.io.readers import read_stack

    rng = np.random.default_rng(0)
    colours = rng.integers(0, 255, (2, 3, 64, 80), dtype=np.uint8)
    as_a_scanner = {"photometric": "rgb", "planarconfig": "separate", "metadata": None}
    tifffile.imwrite(tmp_path / "planar.tif", colours[0], **as_a_scanner)
    tifffile.imwrite(tmp_path / "pages.tif", colours, **as_a_scanner)
    one = read_stack(tmp_path / "planar.tif")
    assert one.rgb and one.planes() == [()]
    np.testing.assert_array_equal(one.read(())[0], np.moveaxis(colours[0], 0, -1))
    pages = read_stack(tmp_path / "pages.tif")
    assert pages.rgb and pages.planes() == [(0,), (1,)]
    np.testing.assert_array_equal(pages.read((1,))[0], np.moveaxis(colours[1], 0, -1))

    index = rng.integers(0, 3, (64, 80), dtype=np.uint8)
    table = np.zeros((3, 256), np.uint16)
    table[:, :3] = 65535 * np.eye(3, dtype=np.uint16)  # index 0 red, 1 green, 2 blue
    tifffile.imwrite(tmp_path / "palette.tif", index, photometric="palette", colormap=table)
    palette = read_stack(tmp_path / "palette.tif")
    assert palette.rgb
    np.testing.assert_array_equal(palette.read(())[0], table.T[index])
    # a grey stack of three pages stays three planes
    tifffile.imwrite(tmp_path / "grey.tif", colours[0], photometric="minisblack")
    assert read_stack(tmp_path / "grey.tif").planes() == [(0,), (1,), (2,)]

    assert main(["run", str(tmp_path / "planar.tif"), "--n-boot", "8", "--quiet",
                 "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "planar.tif.attnreg.npz").exists()


# ---- round 18: a CT volume's planes are slices, named as napari names them ------------------
def test_a_dicom_volume_names_its_slices_z_in_napari_and_on_the_command_line(ct_folder, tmp_path,
                                                                            capsys):
    from napari_attnreg.cli import main
    from napari_attnreg.io.readers import read_source

    (volume, kwargs), = read_dicom(ct_folder)
    assert kwargs["axis_labels"] == ("z", "y", "x")  # the dims slider says z, not 0
    assert read_source(ct_folder)[1].plane_names == ("z",)
    big = tmp_path / "ct64"
    big.mkdir()
    rng = np.random.default_rng(2)
    for k in range(2):
        write_ct_slice(big / f"s{k}.dcm", 2.5 * k, k + 1,
                       rng.integers(900, 1200, (32, 32)).astype(np.uint16))
    out = tmp_path / "out"
    assert main(["run", str(big), "--out", str(out), "--n-boot", "4", "--device", "cpu",
                 "--model", "demo"]) == 0
    said = capsys.readouterr()
    text = said.out + said.err
    assert "ct64, z = 0:" in text and "ct64, z = 1:" in text and "plane 0" not in text


def test_a_scout_is_never_a_slice_even_without_positions(tmp_path):
    from napari_attnreg.io.dicom import group_series

    folder = tmp_path / "ct"
    folder.mkdir()
    for k in range(3):
        write_ct_slice(folder / f"im{k}.dcm", 2.5 * k, k + 1, np.full((8, 8), 1000 + k))
    write_ct_slice(folder / "scout.dcm", 0.0, 0, np.full((8, 8), 3000))
    for path in folder.iterdir():  # an old scanner's (or an anonymiser's) headers
        ds = pydicom.dcmread(path)
        del ds.ImagePositionPatient, ds.ImageOrientationPatient
        ds.ImageType = ["ORIGINAL", "PRIMARY", "LOCALIZER" if path.stem == "scout" else "AXIAL"]
        ds.save_as(path, enforce_file_format=True)
    volumes = read_dicom(folder)
    assert sorted(v.shape for v, _ in volumes) == [(3, 8, 8), (8, 8)]
    (volume, kwargs), = [(v, kw) for v, kw in volumes if v.ndim == 3]
    np.testing.assert_array_equal(volume[:, 0, 0], [1000 - 1024 + k for k in range(3)])
    scout = next(kw for v, kw in volumes if v.ndim == 2)
    assert scout["name"].endswith("localizer scout.dcm")
    assert sorted(len(files) for _, files in group_series(sorted(folder.iterdir()))) == [1, 3]


def test_a_radiographs_detector_spacing_is_brought_to_the_patient(tmp_path):
    # ImagerPixelSpacing is at the detector; the body lies nearer the tube and is drawn
    # larger by the magnification factor the file states: sizes in mm were 10 % too large
    path = tmp_path / "cxr.dcm"
    write_ct_slice(path, 0.0, 1, np.arange(64).reshape(8, 8), modality="DX")
    ds = pydicom.dcmread(path)
    del ds.PixelSpacing
    ds.ImagerPixelSpacing = [0.143, 0.15]
    ds.save_as(path, enforce_file_format=True)
    (_, kwargs), = read_dicom(path)
    assert kwargs["scale"] == pytest.approx((0.143, 0.15))  # no factor stated: as it is
    ds.EstimatedRadiographicMagnificationFactor = 1.1
    ds.save_as(path, enforce_file_format=True)
    (_, kwargs), = read_dicom(path)
    assert kwargs["scale"] == pytest.approx((0.13, 0.15 / 1.1))
    assert kwargs["metadata"]["dicom"]["pixel_spacing"] == pytest.approx((0.13, 0.15 / 1.1))


def test_a_dicom_file_without_its_part_10_header_is_read(tmp_path):
    """Older archives (ACR-NEMA style) and some exports write the dataset alone, without
    the preamble and file meta; pydicom refuses such a file and suggests force=True, which
    an analyst cannot pass, so the run and napari refused it. A .dcm that holds no image
    dataset is still refused."""
    import pydicom

    from napari_attnreg.io.readers import read_source

    pixels = np.random.default_rng(0).integers(900, 1200, (64, 64))
    write_ct_slice(tmp_path / "full.dcm", 0.0, 1, pixels)
    ds = pydicom.dcmread(tmp_path / "full.dcm")
    ds.preamble = None
    del ds.file_meta
    pydicom.dcmwrite(tmp_path / "bare.dcm", ds, enforce_file_format=False, implicit_vr=True,
                     little_endian=True)
    with pytest.raises(pydicom.errors.InvalidDicomError):
        pydicom.dcmread(tmp_path / "bare.dcm")
    (full, _), (bare, _) = (read_dicom(tmp_path / n)[0] for n in ("full.dcm", "bare.dcm"))
    np.testing.assert_array_equal(bare, full)
    stack, info = read_source(tmp_path / "bare.dcm")
    assert stack.planes() == [()] and info.pixel_size == pytest.approx((0.7, 0.5))
    (tmp_path / "notes.dcm").write_bytes(b"\x00\x01" * 200)  # no dataset with an image
    with pytest.raises(ValueError, match="not a readable DICOM file"):
        read_dicom(tmp_path / "notes.dcm")


def test_a_tiff_of_several_images_says_which_one_was_analysed(tmp_path, capsys):
    """A TIFF whose pages differ in size holds several images; the run analysed the first
    alone without a word, untiled or tiled. A palette TIFF read tile by tile gave its colour
    indices."""
    import tifffile

    from napari_attnreg.cli import main
    from napari_attnreg.io.readers import open_for_run

    rng = np.random.default_rng(0)
    with tifffile.TiffWriter(tmp_path / "two.tif") as tif:
        tif.write(rng.integers(0, 255, (200, 200), dtype=np.uint8))
        tif.write(rng.integers(0, 255, (150, 250), dtype=np.uint8))
    for options in ({}, {"tiled": True}):
        _, info = open_for_run(tmp_path / "two.tif", options)
        (note,) = info.notes
        assert "holds 2 images" in note and "(200x200)" in note and "150x250" in note
    assert main(["run", str(tmp_path / "two.tif"), "--n-boot", "4", "--quiet",
                 "--out", str(tmp_path / "out")]) == 0
    assert "only the first (200x200) was analysed" in capsys.readouterr().err

    table = np.zeros((3, 256), np.uint16)
    table[:, :3] = 65535 * np.eye(3, dtype=np.uint16)
    tifffile.imwrite(tmp_path / "palette.tif", rng.integers(0, 3, (64, 80), dtype=np.uint8),
                     photometric="palette", colormap=table)
    stack, _ = open_for_run(tmp_path / "palette.tif", {"tiled": True})
    assert stack.rgb and stack.shape == (64, 80, 3)
