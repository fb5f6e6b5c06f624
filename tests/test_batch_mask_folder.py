"""``--tissue-mask FOLDER``: each input of a batch takes the mask named after it (QuPath's
per-image GeoJSON export, or painted masks), an input without one fails its own row, and a
mask edited since redoes only its input."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import tifffile
from PIL import Image

from napari_attnreg import AttentionResult
from napari_attnreg.cli import main

FAST = ["--model", "demo", "--n-boot", "4", "--device", "cpu", "--quiet", "--tiled"]


def _image(path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tifffile.imwrite(path, (300 + 40 * rng.standard_normal((256, 256))).astype(np.uint16))


def _outline(path, x0: int, x1: int) -> None:  # QuPath's export: pixels of the image
    ring = [[x0, 0], [x1, 0], [x1, 256], [x0, 256], [x0, 0]]
    path.write_text(json.dumps({"type": "FeatureCollection", "features": [
        {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [ring]}}]}))


def _painted(path, x0: int, x1: int) -> None:
    mask = np.zeros((64, 64), np.uint8)
    mask[:, x0 // 4:x1 // 4] = 255
    Image.fromarray(mask).save(path)


def _rows(out) -> dict[str, str]:
    with open(out / "summary.csv", newline="") as fh:
        return {row["source"].rsplit("/", 1)[-1]: row["status"] for row in csv.DictReader(fh)}


def _tiles(out, name: str) -> np.ndarray:
    result = AttentionResult.load(out / f"{name}.attnreg.npz")
    return np.asarray(result.null_summary["tissue_tiles"], bool)


@pytest.fixture
def batch(tmp_path):
    data, masks = tmp_path / "data", tmp_path / "masks"
    masks.mkdir()
    for seed, name in enumerate(["a.tif", "b.tif", "sub/c.tif", "d.tif"]):
        _image(data / name, seed)
    _outline(masks / "a.geojson", 0, 100)  # named without the ending, as QuPath names it
    _painted(masks / "b.tif.png", 156, 256)  # or with it
    (masks / "sub").mkdir()
    _outline(masks / "sub" / "c.geojson", 0, 256)  # beside where c lies among the inputs
    return data, masks, tmp_path / "out"


def test_each_input_takes_the_mask_named_after_it(batch):
    data, masks, out = batch
    assert main(["run", str(data), "--recursive", "--tissue-mask", str(masks),
                 "--out", str(out), *FAST]) == 1  # d has no mask: its row failed
    rows = _rows(out)
    assert rows["a.tif"] == rows["b.tif"] == rows["c.tif"] == "done"
    assert rows["d.tif"].startswith("failed: tissue_mask: no mask for d.tif")
    assert "d.tif{" in rows["d.tif"] and "--tissue-mask auto or none" in rows["d.tif"]
    a, b, c = _tiles(out, "a.tif"), _tiles(out, "b.tif"), _tiles(out, "sub/c.tif")
    n = int(round(np.sqrt(a.size)))
    assert a.reshape(n, n)[:, 0].all() and not a.reshape(n, n)[:, -1].any()  # the left part
    assert b.reshape(n, n)[:, -1].all() and not b.reshape(n, n)[:, 0].any()  # the right part
    assert c.all()
    meta = AttentionResult.load(out / "a.tif.attnreg.npz").metadata
    assert "a.geojson" in meta["tissue_mask"]

    # a rerun keeps every result; an edited mask redoes its own input only
    _painted(masks / "b.tif.png", 100, 256)
    assert main(["run", str(data / "a.tif"), str(data / "b.tif"), "--tissue-mask", str(masks),
                 "--out", str(out), *FAST]) == 0
    rows = _rows(out)
    assert rows["a.tif"] == "skipped (exists)" and rows["b.tif"] == "done"
    assert _tiles(out, "b.tif").sum() > b.sum()


def test_two_masks_for_one_input_fail_its_row_and_an_empty_folder_is_refused(batch, tmp_path):
    data, masks, out = batch
    _painted(masks / "a.png", 0, 50)
    assert main(["run", str(data / "a.tif"), str(data / "b.tif"), "--tissue-mask", str(masks),
                 "--out", str(out), *FAST]) == 1
    rows = _rows(out)
    assert rows["a.tif"].startswith("failed: tissue_mask: 2 masks") and "keep one" in rows["a.tif"]
    assert rows["b.tif"] == "done"

    empty = tmp_path / "no masks"
    empty.mkdir()
    assert main(["run", str(data / "a.tif"), "--tissue-mask", str(empty),
                 "--out", str(tmp_path / "out2"), *FAST]) == 2
    assert not (tmp_path / "out2" / "summary.csv").exists()


def test_a_folder_of_masks_is_for_batches(batch):
    from napari_attnreg import regularize

    data, masks, _ = batch
    image = tifffile.imread(data / "a.tif")
    with pytest.raises(ValueError, match="is a folder; a folder of masks"):
        regularize(image, "demo", tiled=True, tissue_mask=str(masks), n_boot=4, device="cpu")


def test_a_folder_of_masks_inside_the_input_folder_is_not_taken_for_inputs(batch, capsys):
    # masks kept beside the slides (data/masks/a.png for data/a.tif): a recursive batch used to
    # run each mask as an image of its own, with itself as its own mask
    data, _, out = batch
    masks = data / "masks"
    masks.mkdir()
    _painted(masks / "a.png", 0, 100)
    _painted(masks / "b.png", 156, 256)
    assert main(["run", str(data), "--recursive", "--tissue-mask", str(masks),
                 "--out", str(out), *FAST]) == 1  # d.tif and sub/c.tif have no mask there
    rows = _rows(out)
    assert sorted(rows) == ["a.tif", "b.tif", "c.tif", "d.tif"]
    assert rows["a.tif"] == rows["b.tif"] == "done"
    assert not (out / "masks").exists()
    assert "masks" not in capsys.readouterr().err.split("model:")[0]  # not named as skipped


def test_the_output_folder_inside_the_input_folder_is_not_named_as_skipped(tmp_path, capsys):
    data = tmp_path / "data"
    _image(data / "a.tif", 0)
    for _ in range(2):
        assert main(["run", str(data), "--out", str(data / "out"), *FAST]) == 0
    err = capsys.readouterr().err
    assert "not images" not in err and "subfolder" not in err
