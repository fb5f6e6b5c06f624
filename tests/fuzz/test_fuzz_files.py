"""Fuzz: mutated image files (issue #18). Every damaged TIFF/PNG/OME-TIFF/DICOM is read or
gives one clear ValueError naming the file, never another exception; a batch over a folder
of them always finishes with a complete summary.csv.

Seeded, so a failure reproduces: the mutations are made from small valid files the test
writes itself, with byte flips, truncations and header field changes.
"""

from __future__ import annotations

import csv
import random
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tifffile

from napari_attnreg.batch.items import collect_inputs
from napari_attnreg.batch.run import run_batch
from napari_attnreg.io.dicom import read_dicom
from napari_attnreg.io.ometiff import read_ome_tiff
from napari_attnreg.io.readers import read_source, read_stack

SEED = 2026
MUTANTS_PER_FILE = 150  # 7 seed files: 1,050 mutated files
INTERESTING = (0x00, 0x01, 0x7F, 0x80, 0xFF)


def _image(shape=(48, 40)) -> np.ndarray:
    rng = np.random.default_rng(0)
    img = 300 + 40 * rng.standard_normal(shape)
    img[10:20, 12:24] += 2000
    return img.astype(np.uint16)


def _dicom(path: Path, z_mm: float = 0.0, instance: int = 1, shape=(16, 12)) -> None:
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.2"
    # the same UIDs every run: byte offsets, and so the seeded mutants, reproduce
    meta.MediaStorageSOPInstanceUID = generate_uid(entropy_srcs=[path.name, str(z_mm)])
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID = meta.MediaStorageSOPClassUID
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Modality, ds.SeriesInstanceUID, ds.SeriesNumber = "CT", "1.2.3.4", 1
    ds.ImagePositionPatient, ds.ImageOrientationPatient = [0.0, 0.0, z_mm], [1, 0, 0, 0, 1, 0]
    ds.PixelSpacing, ds.RescaleSlope, ds.RescaleIntercept = [0.5, 0.5], 1, -1024
    ds.InstanceNumber, ds.SliceThickness = instance, 2.5
    ds.WindowCenter, ds.WindowWidth = 40, 400
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    pixels = _image(shape)
    ds.Rows, ds.Columns = pixels.shape
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
    ds.PixelData = pixels.tobytes()
    ds.save_as(path, enforce_file_format=True)


def _seed_files(folder: Path) -> dict[str, Path]:
    """Small valid files of every format the readers take."""
    import imageio.v3 as iio

    folder.mkdir()
    files = {
        "plain.tif": lambda p: tifffile.imwrite(p, _image()),
        "tiled.tif": lambda p: tifffile.imwrite(p, _image((64, 64)), tile=(32, 32),
                                                compression="zlib"),
        "stack.tif": lambda p: tifffile.imwrite(p, np.stack([_image(), _image()]),
                                                metadata={"axes": "ZYX"}),
        "img.png": lambda p: iio.imwrite(p, (_image() // 256).astype(np.uint8)),
        "cells.ome.tif": lambda p: tifffile.imwrite(
            p, np.stack([_image(), _image()]), ome=True,
            metadata={"axes": "CYX", "PhysicalSizeX": 0.5, "PhysicalSizeY": 0.5}),
        "rgb.png": lambda p: iio.imwrite(p, np.dstack([(_image() // 256).astype(np.uint8)] * 3)),
        "ct.dcm": _dicom,
    }
    paths = {}
    for name, write in files.items():
        write(folder / name)
        paths[name] = folder / name
    return paths


def _mutate(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One mutation: flipped bytes, a truncation, or a header field set to an edge value."""
    kind = rng.choice(("flip", "truncate", "header"))
    buf = bytearray(data)
    if kind == "truncate":
        return kind, bytes(buf[: rng.randrange(0, len(buf))])
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        return kind, bytes(buf)
    # header fields live in the first bytes (TIFF IFD, PNG IHDR, DICOM's first elements)
    start = rng.randrange(min(len(buf), 400))
    for i in range(start, min(len(buf), start + rng.choice((1, 2, 4)))):
        buf[i] = rng.choice(INTERESTING)
    return kind, bytes(buf)


def _reader(name: str) -> Callable[[Path], object]:
    if name.endswith(".dcm"):
        return read_dicom
    if name.endswith(".ome.tif"):
        return lambda p: (read_ome_tiff(p), read_stack(p))
    return read_stack


def _outcome(read: Callable[[Path], object], path: Path) -> str:
    """``read ok`` or ``clear error (<cause>)``; anything else fails the test."""
    try:
        read(path)
    except ValueError as err:
        assert path.name in str(err) or str(path) in str(err), f"{path}: {err!r} names no file"
        cause = type(err.__cause__ if err.__cause__ is not None else err)
        name = cause.__name__ if cause.__name__ != "error" else f"{cause.__module__}.error"
        return f"clear error ({name})"
    return "read ok"


def test_a_thousand_mutated_files_read_or_fail_clearly(tmp_path):
    seeds = _seed_files(tmp_path / "seeds")
    for name, path in seeds.items():  # the unmutated files are readable
        assert _outcome(_reader(name), path) == "read ok", name
    rng = random.Random(SEED)
    mutants = tmp_path / "mutants"
    mutants.mkdir()
    counts: Counter[str] = Counter()
    unexpected = []
    t0 = time.perf_counter()
    for name, path in seeds.items():
        data, read = path.read_bytes(), _reader(name)
        for i in range(MUTANTS_PER_FILE):
            kind, mutated = _mutate(data, rng)
            target = mutants / f"{i:03d}-{kind}-{name}"
            target.write_bytes(mutated)
            try:
                counts[_outcome(read, target)] += 1
            except Exception as err:  # noqa: BLE001  collected, reported all at once below
                unexpected.append(f"{target.name}: {type(err).__name__}: {err}")
            target.unlink()  # keeps the folder small; the seed reproduces it
    seconds = time.perf_counter() - t0
    total = sum(counts.values()) + len(unexpected)
    print(f"\nmutated files: {total} in {seconds:.1f} s")
    for outcome, n in sorted(counts.items()):
        print(f"  {outcome}: {n}")
    assert total >= 1000
    assert not unexpected, "\n".join(unexpected[:20])


@pytest.fixture
def damaged_folder(tmp_path):
    """Two good images and damaged ones of each kind the batch takes."""
    seeds = _seed_files(tmp_path / "seeds")
    folder = tmp_path / "in"
    folder.mkdir()
    rng = random.Random(SEED + 1)
    for name in ("plain.tif", "img.png"):
        (folder / name).write_bytes(seeds[name].read_bytes())
    for name in ("tiled.tif", "stack.tif", "img.png", "cells.ome.tif"):
        data = seeds[name].read_bytes()
        (folder / f"cut-{name}").write_bytes(data[: len(data) * 2 // 3])
        (folder / f"mut-{name}").write_bytes(_mutate(data, rng)[1])
    (folder / "four.tif").write_bytes(b"II*\x00")
    return folder


def test_a_batch_over_damaged_files_always_finishes_with_a_complete_summary(
        damaged_folder, tmp_path, tiny_backbone):
    items = collect_inputs([damaged_folder])
    out = tmp_path / "out"
    report = run_batch(items, out, tiny_backbone, None, {"n_boot": 3, "chunk_size": 3,
                                                        "device": "cpu"}, quiet=True)
    with open(out / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["source"] for r in rows} == {str(i.source) for i in items}
    statuses = Counter(r["status"].split(":")[0] for r in rows)
    print(f"\nbatch over {len(items)} files: {dict(statuses)}")
    assert set(statuses) <= {"done", "failed"} and statuses["done"] >= 2
    for row in rows:
        if row["status"].startswith("failed"):
            assert Path(row["source"]).name in row["status"] or "constant" in row["status"] \
                or "too small" in row["status"], row["status"]
        else:
            assert Path(row["output"]).is_file()
    assert len(report.rows) == len(rows)


# ---- issue #27: DICOM folder scans, header edits and deleted elements -------------------------
DICOM_MUTANTS = 48
#: The tag of PixelData: the header is everything before it.
_PIXEL_DATA_TAG = b"\xe0\x7f\x10\x00"


def _dicom_folder(folder: Path) -> None:
    """Three slices of one series, 2.5 mm apart, and a good TIFF beside them."""
    folder.mkdir(parents=True)
    for k in range(3):
        _dicom(folder / f"slice{k}.dcm", z_mm=2.5 * k, instance=k + 1, shape=(32, 32))
    tifffile.imwrite(folder / "good.tif", _image((32, 32)))


def _mutate_header(path: Path, rng: random.Random) -> str:
    """Damage one DICOM file's header: edited or flipped bytes before the pixel data (text
    values such as ``1.0`` become ``q.0``), or an element deleted (not the pixel data: a file
    without it is no image and is skipped as a DICOMDIR is)."""
    kind = rng.choice(("edit", "flip", "delete"))
    if kind == "delete":
        import pydicom

        ds = pydicom.dcmread(path)
        tags = [t for t in ds.keys() if t != 0x7FE00010]
        tag = rng.choice(tags)
        del ds[tag]
        ds.save_as(path, enforce_file_format=False)
        return f"delete {pydicom.datadict.keyword_for_tag(tag) or tag}"
    buf = bytearray(path.read_bytes())
    end = buf.find(_PIXEL_DATA_TAG)
    where = rng.randrange(132, end)  # after the preamble and the DICM marker
    if kind == "flip":
        buf[where] ^= 1 << rng.randrange(8)
    else:
        buf[where] = rng.choice((*INTERESTING, *b"q.-\\ 9e"))
    path.write_bytes(bytes(buf))
    return f"{kind} byte {where}"


def _scan_outcome(folder: Path) -> tuple[list[str], list[str]]:
    """Scan and read a folder as a batch does: the outcome of each input, and what breaks
    the rules (an abort, a file left without an input, an error naming no file)."""
    broken: list[str] = []
    try:
        items = collect_inputs([folder])
    except Exception as err:  # noqa: BLE001  collected, reported all at once
        return [], [f"the scan aborted: {type(err).__name__}: {err}"]
    covered = {p.name for i in items for p in (i.source, *i.files)}
    broken += [f"{p.name} has no input" for p in folder.glob("*.dcm") if p.name not in covered]
    outcomes = []
    for item in items:
        try:
            read_source(item.source, None, item.files or None)
            outcomes.append("read ok")
        except ValueError as err:
            names = {p.name for p in (item.source, *item.files)}
            if not any(name in str(err) for name in names):
                broken.append(f"{item.source.name}: {err} names no file")
            outcomes.append("clear error")
        except Exception as err:  # noqa: BLE001
            broken.append(f"{item.source.name}: {type(err).__name__}: {err}")
    if "good.tif" not in {i.source.name for i in items}:
        broken.append("the good TIFF is not an input")
    return outcomes, broken


def test_dicom_folders_with_damaged_headers_give_every_file_an_input_or_a_clear_error(tmp_path):
    rng = random.Random(SEED + 27)
    counts: Counter[str] = Counter()
    unexpected = []
    for i in range(DICOM_MUTANTS):
        folder = tmp_path / f"m{i:02d}"
        _dicom_folder(folder)
        target = folder / f"slice{rng.randrange(3)}.dcm"
        how = _mutate_header(target, rng)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # damaged descriptive values: warned, ignored
            outcomes, broken = _scan_outcome(folder)
        counts.update(outcomes)
        unexpected += [f"mutant {i} ({target.name}: {how}): {b}" for b in broken]
    print(f"\nDICOM folder mutants: {DICOM_MUTANTS}; inputs: {dict(counts)}")
    assert not unexpected, "\n".join(unexpected[:20])
    assert counts["clear error"] > 0 and counts["read ok"] > DICOM_MUTANTS


def test_a_batch_over_dicom_folders_with_damaged_headers_has_a_row_per_file(tmp_path,
                                                                            tiny_backbone):
    """The reported abort, end to end: damaged headers beside good slices and a good TIFF."""
    rng = random.Random(SEED + 28)
    folders = []
    while len(folders) < 3:  # three folders whose damage fails a file
        folder = tmp_path / f"m{len(folders)}-{rng.randrange(10**6)}"
        _dicom_folder(folder)
        _mutate_header(folder / "slice1.dcm", rng)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outcomes, broken = _scan_outcome(folder)
        assert not broken, broken
        folders += [folder] if "clear error" in outcomes else []
    items = collect_inputs(folders)
    out = tmp_path / "out"
    run_batch(items, out, tiny_backbone, None, {"n_boot": 2, "chunk_size": 2, "device": "cpu"},
              quiet=True)
    with open(out / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["source"] for r in rows} == {str(i.source) for i in items}
    assert sum(Path(r["source"]).name == "good.tif" and r["status"] == "done" for r in rows) == 3
    for row in rows:
        if row["status"].startswith("failed"):
            assert ".dcm" in row["status"], row["status"]
