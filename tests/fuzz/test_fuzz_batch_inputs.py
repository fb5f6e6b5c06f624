"""Inputs that once ended a batch or left no row: a 255-byte name, a broken link, an image
too large for an untiled run, a target size beyond any budget, inputs deleted since an
earlier run. Each ends as a row naming the file (or one error line naming the option), a
complete ``summary.csv`` and a non-zero exit, never a traceback."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import pytest
import tifffile

from napari_attnreg.cli import main

FAST = ["--model", "demo", "--n-boot", "4", "--device", "cpu", "--quiet"]


def _image(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = 300 + 40 * rng.standard_normal((64, 64))
    img[20:30, 20:30] += 2000
    return img.astype(np.uint16)


def _run(capsys, *args) -> tuple[int, str]:
    code = main(["run", *map(str, args)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def _rows(out: Path) -> dict[str, str]:
    with open(out / "summary.csv", newline="", encoding="utf-8") as fh:
        return {Path(r["source"]).name: r["status"] for r in csv.DictReader(fh)}


def test_a_255_byte_input_name_is_its_rows_error_and_the_batch_goes_on(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    long_name = "x" * (255 - len(".tif")) + ".tif"
    try:
        tifffile.imwrite(folder / long_name, _image(1))
    except OSError:
        pytest.skip("this file system does not take 255-byte names")
    tifffile.imwrite(folder / "z_later.tif", _image(2))
    out = tmp_path / "out"
    code, err = _run(capsys, folder, "--out", out, *FAST)
    rows = _rows(out)
    assert code == 1 and rows["z_later.tif"] == "done"
    assert rows[long_name].startswith("failed: ") and "rename the input" in rows[long_name]
    assert long_name in err


def test_a_broken_link_in_an_input_folder_gets_a_row(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    tifffile.imwrite(folder / "good.tif", _image(1))
    (folder / "gone.tif").symlink_to(tmp_path / "moved-away.tif")
    (folder / "gone.dcm").symlink_to(tmp_path / "moved-away.dcm")
    out = tmp_path / "out"
    code, err = _run(capsys, folder, "--out", out, *FAST)
    rows = _rows(out)
    assert code == 1 and rows["good.tif"] == "done"
    for name in ("gone.tif", "gone.dcm"):
        assert rows[name].startswith("failed: ") and "broken symbolic link" in rows[name]
        assert str(folder / name) in err


def test_an_image_too_large_for_an_untiled_run_is_its_rows_error(tmp_path, capsys):
    big = tmp_path / "huge.tif"
    # the header says 30000 x 30000; the pixels are never written (a sparse file)
    tifffile.imwrite(big, shape=(30000, 30000), dtype=np.uint8)
    good = tmp_path / "small.tif"
    tifffile.imwrite(good, _image(1))
    out = tmp_path / "out"
    code, err = _run(capsys, big, good, "--out", out, *FAST)
    rows = _rows(out)
    assert code == 1 and rows["small.tif"] == "done"
    assert rows["huge.tif"].startswith("failed: ") and "30000x30000" in rows["huge.tif"]
    assert "--tiled" in rows["huge.tif"] and str(big) in err


@pytest.mark.parametrize("size", ["1000000", "100000"])
def test_a_target_size_beyond_the_budget_is_one_error_naming_the_option(tmp_path, capsys,
                                                                        size):
    good = tmp_path / "good.tif"
    tifffile.imwrite(good, _image(1))
    out = tmp_path / "out"
    code, err = _run(capsys, good, "--out", out, *FAST, "--target-size", size)
    assert code == 2 and err.count("\n") == 1
    assert "target_size" in err and "8192" in err and "--tiled" in err
    assert not (out / "summary.csv").exists()


def test_rows_of_inputs_deleted_since_are_marked_stale(tmp_path, capsys):
    a, b = tmp_path / "a.tif", tmp_path / "b.tif"
    tifffile.imwrite(a, _image(1))
    tifffile.imwrite(b, _image(2))
    out = tmp_path / "out"
    assert _run(capsys, a, b, "--out", out, *FAST)[0] == 0
    a.rename(tmp_path / "renamed.tif")
    assert _run(capsys, b, "--out", out, *FAST)[0] == 0
    rows = _rows(out)
    assert rows == {"a.tif": "stale: the input no longer exists", "b.tif": "skipped (exists)"}
    os.remove(b)
    assert _run(capsys, tmp_path / "renamed.tif", "--out", out, *FAST)[0] == 0
    rows = _rows(out)
    assert rows["b.tif"].startswith("stale") and rows["renamed.tif"] == "done"
