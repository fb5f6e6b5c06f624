"""Damaged DICOM headers (issue #27 item 4): a file whose header values cannot place or scale
its image is refused on its own, naming the file and the element, and never takes its
folder's other inputs with it; a damaged value that only describes the image (pixel
spacing, slice thickness, the display window) is ignored with a warning naming both."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import numpy as np
import pytest
import tifffile

from napari_attnreg.batch.items import collect_inputs
from napari_attnreg.batch.run import run_batch
from napari_attnreg.io.dicom import DicomHeaderError, group_series, read_dicom
from napari_attnreg.io.readers import read_source

pydicom = pytest.importorskip("pydicom")


def write_slice(path: Path, z_mm: float, instance: int, pixels: np.ndarray) -> None:
    """A CT slice with every element the reader uses (values stored as text where DICOM does)."""
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.2"
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, generate_uid()
    ds.Modality, ds.SeriesInstanceUID, ds.SeriesNumber = "CT", "1.2.3.4", 2
    ds.InstanceNumber = instance
    ds.ImagePositionPatient = [-100.0, -120.0, z_mm]
    ds.ImageOrientationPatient = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    ds.PixelSpacing, ds.SliceThickness = [0.5, 0.5], 2.5
    ds.RescaleSlope, ds.RescaleIntercept = 1.0, -1024.0
    ds.WindowCenter, ds.WindowWidth = 40.0, 400.0
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.Rows, ds.Columns = pixels.shape
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
    ds.PixelData = pixels.astype(np.uint16).tobytes()
    ds.save_as(path, enforce_file_format=True)


def ct_folder(folder: Path, n: int = 3, size: int = 32) -> Path:
    """``n`` slices 2.5 mm apart (``s0.dcm`` ... ) and a good TIFF beside them."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for k in range(n):
        pixels = 1000 + 200 * rng.random((size, size))
        pixels[4 + 6 * k:10 + 6 * k, 8:20] += 800
        write_slice(folder / f"s{k}.dcm", -40.0 + 2.5 * k, k + 1, pixels)
    tifffile.imwrite(folder / "good.tif", (1000 + 300 * rng.random((size, size))).astype(np.uint16))
    return folder


def replace_bytes(path: Path, old: bytes, new: bytes) -> None:
    """A same-length edit of a header value, as a flipped byte leaves it."""
    data = path.read_bytes()
    assert len(old) == len(new) and data.count(old) == 1, old
    path.write_bytes(data.replace(old, new))


def edit_dataset(path: Path, change) -> None:
    ds = pydicom.dcmread(path)
    change(ds)
    ds.save_as(path, enforce_file_format=True)


#: Header damage that leaves a slice unplaceable or its values unknown: (edit, element).
REFUSED = {
    "orientation flipped byte": (lambda p: replace_bytes(p, b"1.0\\0.0\\0.0\\0.0\\1.0",
                                                         b"q.0\\0.0\\0.0\\0.0\\1.0"),
                                 "ImageOrientationPatient"),
    "position not a number": (lambda p: replace_bytes(p, b"-100.0", b"-1x0.0"),
                              "ImagePositionPatient"),
    "position of 2 values": (lambda p: edit_dataset(
        p, lambda ds: setattr(ds, "ImagePositionPatient", [-100.0, -120.0])),
        "ImagePositionPatient"),
    "slope not a number": (lambda p: replace_bytes(p, b"DS\x04\x001.0 ", b"DS\x04\x001x0 "),
                           "RescaleSlope"),
    "rows deleted": (lambda p: edit_dataset(p, lambda ds: ds.__delitem__("Rows")), "Rows"),
}

#: Damage to values that only describe the image: (edit, element), read with a warning.
IGNORED = {
    "window centre not a number": (lambda p: replace_bytes(p, b"DS\x04\x0040.0",
                                                           b"DS\x04\x004x.0"), "WindowCenter"),
    "slice thickness not a number": (lambda p: replace_bytes(p, b"DS\x04\x002.5 ",
                                                             b"DS\x04\x002x5 "),
                                     "SliceThickness"),
    "pixel spacing of 1 value": (lambda p: edit_dataset(
        p, lambda ds: setattr(ds, "PixelSpacing", [0.5])), "PixelSpacing"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_slice_with_a_damaged_geometry_or_rescale_is_its_own_failed_input(tmp_path, case):
    edit, element = REFUSED[case]
    folder = ct_folder(tmp_path / "in")
    edit(folder / "s1.dcm")
    groups = dict(group_series(sorted(folder.glob("*.dcm"))))
    assert sorted(len(g) for g in groups.values()) == [1, 2]  # never an abort, never dropped
    assert (folder / "s1.dcm",) in groups.values()
    with pytest.raises(DicomHeaderError, match=rf"s1\.dcm.*{element}"):
        read_source(folder / "s1.dcm")
    with pytest.warns(UserWarning, match=rf"s1\.dcm.*{element}.*left out"):
        (volume, _), = read_dicom(folder)  # napari's folder read: the other slices, said so
    assert volume.shape == (2, 32, 32)


def test_a_damaged_slice_alone_in_its_folder_is_one_input_that_says_why(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    write_slice(folder / "only.dcm", 0.0, 1, np.zeros((8, 8)))
    edit_dataset(folder / "only.dcm", lambda ds: ds.__delitem__("Rows"))
    item, = collect_inputs([folder])  # was: commonpath() arg is an empty sequence
    assert item.source == folder / "only.dcm"
    with pytest.raises(ValueError, match=r"only\.dcm.*no usable Rows"):
        read_source(item.source, None, item.files or None)


@pytest.mark.parametrize("case", sorted(IGNORED))
def test_a_damaged_descriptive_value_is_ignored_with_a_warning(tmp_path, case):
    edit, element = IGNORED[case]
    folder = ct_folder(tmp_path / "in")
    for name in ("s0.dcm", "s1.dcm", "s2.dcm"):
        edit(folder / name)
    with pytest.warns(UserWarning, match=rf"s0\.dcm.*{element}.*ignored"):
        (volume, kwargs), = read_dicom(folder)
    assert volume.shape == (3, 32, 32)
    if element == "WindowCenter":
        assert "contrast_limits" not in kwargs
    if element == "PixelSpacing":
        assert kwargs["scale"][1:] == (1.0, 1.0)
        assert kwargs["metadata"]["dicom"]["pixel_spacing"] is None
    if element == "SliceThickness":  # positions give the spacing; the thickness is unused
        assert kwargs["scale"][0] == pytest.approx(2.5)


def test_a_single_slice_with_a_damaged_thickness_and_spacing_still_reads(tmp_path):
    path = tmp_path / "one.dcm"
    write_slice(path, 0.0, 1, np.full((8, 8), 1000))
    edit_dataset(path, lambda ds: setattr(ds, "PixelSpacing", [0.5]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stack, info = read_source(path)
    assert stack.n_planes == 1 and info.pixel_size is None
    assert any("PixelSpacing" in str(w.message) and "one.dcm" in str(w.message) for w in caught)


def test_a_damaged_header_in_a_folder_batch_fails_only_its_own_row(tmp_path, tiny_backbone):
    """The reported abort: one flipped byte in ImageOrientationPatient stopped the whole
    batch (no summary.csv, the good TIFF never run)."""
    folder = ct_folder(tmp_path / "in", n=4)
    REFUSED["orientation flipped byte"][0](folder / "s1.dcm")
    REFUSED["rows deleted"][0](folder / "s2.dcm")
    items = collect_inputs([folder])
    out = tmp_path / "out"
    run_batch(items, out, tiny_backbone, None, {"n_boot": 3, "chunk_size": 3, "device": "cpu"},
              quiet=True)
    with open(out / "summary.csv", newline="") as fh:
        rows = {Path(r["source"]).name: r["status"] for r in csv.DictReader(fh)}
    assert rows["good.tif"] == "done"
    assert set(rows) == {"good.tif", "in", "s1.dcm", "s2.dcm"}
    assert rows["in"] == "done"  # the series of the two slices that are left
    assert rows["s1.dcm"].startswith("failed") and "ImageOrientationPatient" in rows["s1.dcm"]
    assert "s1.dcm" in rows["s1.dcm"]
    assert rows["s2.dcm"].startswith("failed") and "Rows" in rows["s2.dcm"]


def test_uint32_values_with_a_fractional_intercept_keep_their_precision(tmp_path):
    """Issue #27 item 13: float32 holds 24 bits, so 3,000,000,001 + 0.5 came back rounded."""
    path = tmp_path / "u32.dcm"
    write_slice(path, 0.0, 1, np.zeros((2, 3)))
    ds = pydicom.dcmread(path)
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 32, 32, 31
    ds.RescaleIntercept = 0.5
    stored = np.array([[0, 1, 2], [3, 3_000_000_000, 3_000_000_001]], np.uint32)
    ds.PixelData = stored.tobytes()
    ds.save_as(path, enforce_file_format=True)
    (volume, _), = read_dicom(path)
    assert volume.dtype == np.float64
    np.testing.assert_array_equal(volume, stored.astype(np.float64) + 0.5)
