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
from napari_attnreg.io.readers import read_stack

SEED = 2026
MUTANTS_PER_FILE = 150  # 7 seed files: 1,050 mutated files
INTERESTING = (0x00, 0x01, 0x7F, 0x80, 0xFF)


def _image(shape=(48, 40)) -> np.ndarray:
    rng = np.random.default_rng(0)
    img = 300 + 40 * rng.standard_normal(shape)
    img[10:20, 12:24] += 2000
    return img.astype(np.uint16)


def _dicom(path: Path) -> None:
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.2"
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, generate_uid()
    ds.Modality, ds.SeriesInstanceUID, ds.SeriesNumber = "CT", "1.2.3.4", 1
    ds.ImagePositionPatient, ds.ImageOrientationPatient = [0.0, 0.0, 0.0], [1, 0, 0, 0, 1, 0]
    ds.PixelSpacing, ds.RescaleSlope, ds.RescaleIntercept = [0.5, 0.5], 1, -1024
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    pixels = _image((16, 12))
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
