"""The batch and its options: a changed tissue-mask file reruns its image, a user's files beside
the results are never replaced without --overwrite, and options that cannot go together
(--level with --mpp, a tissue mask on an untiled run) are refused once, before any file."""

from __future__ import annotations

import csv
import json
import math
import os

import numpy as np
import pytest
import test_slides  # the slide fixtures (tests/ is on the path, as pytest imports tests)
import tifffile
from PIL import Image

from napari_attnreg import AttentionResult
from napari_attnreg.batch.resume import run_signature
from napari_attnreg.cli import main
from napari_attnreg.core.run.config import RunConfig
from napari_attnreg.core.run.options import reset_inapplicable
from napari_attnreg.core.run.service import ModelSpec

FAST = ["--model", "demo", "--n-boot", "4", "--device", "cpu", "--quiet"]


def _img(seed: int, shape=(64, 64)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = 300 + 40 * rng.standard_normal(shape)
    img[20:30, 20:30] += 2000 + 100 * seed
    return img.astype(np.uint16)


def _statuses(out) -> list[str]:
    with open(out / "summary.csv", newline="") as fh:
        return [row["status"] for row in csv.DictReader(fh)]


def _mask(path, rows: slice) -> None:
    mask = np.zeros((16, 16), np.uint8)
    mask[rows] = 255
    if path.suffix == ".tif":  # uncompressed: every mask has the same size
        tifffile.imwrite(path, mask)
    else:
        Image.fromarray(mask).save(path)


# ---- 1. a tissue mask file is fingerprinted by its content --------------------------------
def test_the_run_signature_fingerprints_the_tissue_mask_files_content(tmp_path):
    mask = tmp_path / "mask.tif"
    _mask(mask, slice(0, 8))
    opts = {"tiled": True, "tissue_mask": str(mask), "device": "cpu"}
    before = run_signature(ModelSpec("demo"), opts)
    stat = mask.stat()
    _mask(mask, slice(8, 16))  # the same size, another mask, its old modification time
    os.utime(mask, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert mask.stat().st_size == stat.st_size
    after = run_signature(ModelSpec("demo"), opts)
    assert before["tissue_mask"] == after["tissue_mask"] == str(mask)
    assert before != after
    # no mask file: nothing to fingerprint, the signature is as before this change
    assert "tissue_mask_file" not in run_signature(ModelSpec("demo"), {"tiled": True,
                                                                       "tissue_mask": "auto"})


def test_a_rerun_with_a_rewritten_tissue_mask_redoes_the_image(tmp_path, capsys):
    src, mask, out = tmp_path / "big.tif", tmp_path / "mask.png", tmp_path / "out"
    tifffile.imwrite(src, _img(1, shape=(128, 128)))
    _mask(mask, slice(0, 16))
    args = ["run", str(src), "--tiled", "--tissue-mask", str(mask), "--out", str(out), *FAST]
    assert main(args) == 0
    first = AttentionResult.load(out / "big.tif.attnreg.npz").null_summary["tissue_mask"]
    assert main(args) == 0 and _statuses(out) == ["skipped (exists)"]
    _mask(mask, slice(0, 6))  # the top rows only: fewer tissue tiles
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert _statuses(out) == ["done"] and "tissue_mask" in err and "1 done, 0 skipped" in err
    redone = AttentionResult.load(out / "big.tif.attnreg.npz").null_summary["tissue_mask"]
    assert not np.array_equal(np.asarray(redone), np.asarray(first))  # the new mask was used


# ---- 2. files the tool did not write are never replaced without --overwrite ----------------
def test_a_users_figure_and_geojson_beside_a_fresh_result_are_kept(tmp_path, capsys):
    src, out = tmp_path / "a.tif", tmp_path / "out"
    tifffile.imwrite(src, _img(1))
    out.mkdir()
    figure, geo = out / "a.tif.attnreg.png", out / "a.tif.geojson"
    figure.write_bytes(b"my own picture")
    geo.write_text('{"mine": true}', encoding="utf-8")
    args = ["run", str(src), "--out", str(out), "--geojson", *FAST]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert _statuses(out) == ["done"] and (out / "a.tif.attnreg.npz").is_file()
    assert figure.read_bytes() == b"my own picture"
    assert geo.read_text(encoding="utf-8") == '{"mine": true}'
    assert str(figure) in err and str(geo) in err and err.count("--overwrite") >= 2
    # the kept files do not make every later run redo the image
    assert main(args) == 0 and _statuses(out) == ["skipped (exists)"]
    assert figure.read_bytes() == b"my own picture"
    assert geo.read_text(encoding="utf-8") == '{"mine": true}'
    assert main([*args, "--overwrite"]) == 0  # when asked
    assert figure.read_bytes()[:4] == b"\x89PNG"
    assert json.loads(geo.read_text(encoding="utf-8"))["type"] == "FeatureCollection"


def test_the_geojson_of_a_skipped_result_is_not_rewritten_and_an_edited_one_is_kept(
        tmp_path, capsys):
    src, out = tmp_path / "a.tif", tmp_path / "out"
    tifffile.imwrite(src, _img(1))
    args = ["run", str(src), "--out", str(out), "--geojson", *FAST]
    assert main(args) == 0
    geo = out / "a.tif.geojson"
    assert json.loads(geo.read_text(encoding="utf-8"))["type"] == "FeatureCollection"
    geo.write_text('{"edited": "in QuPath"}', encoding="utf-8")
    capsys.readouterr()
    assert main(args) == 0  # the result is current: its artefacts are left alone
    err = capsys.readouterr().err
    assert _statuses(out) == ["skipped (exists)"] and "0 done, 1 skipped" in err
    assert geo.read_text(encoding="utf-8") == '{"edited": "in QuPath"}'
    assert f"wrote {geo}" not in err
    # a result redone for other options keeps the edited file (it is no longer the tool's)
    assert main([*args, "--seed", "9"]) == 0
    err = capsys.readouterr().err
    assert _statuses(out) == ["done"] and str(geo) in err and "--overwrite" in err
    assert geo.read_text(encoding="utf-8") == '{"edited": "in QuPath"}'
    # a missing one is made for a kept result; the tool's own is replaced when redone
    geo.unlink()
    assert main([*args, "--seed", "9"]) == 0
    assert _statuses(out) == ["skipped (exists)"] and f"wrote {geo}" in capsys.readouterr().err
    made = geo.read_bytes()
    assert main(args) == 0  # the seed again: redone, and its own geojson rewritten
    err = capsys.readouterr().err
    assert _statuses(out) == ["done"] and "--overwrite" not in err
    assert json.loads(geo.read_text(encoding="utf-8"))["type"] == "FeatureCollection"
    assert geo.stat().st_size > 0 and made is not None


def test_a_result_redone_without_geojson_or_figure_leaves_none_of_its_old_files_stale(
        tmp_path, capsys):
    from napari_attnreg.batch.resume import owns

    src, out = tmp_path / "a.tif", tmp_path / "out"
    tifffile.imwrite(src, _img(1))
    assert main(["run", str(src), "--out", str(out), "--geojson", *FAST]) == 0
    geo, figure = out / "a.tif.geojson", out / "a.tif.attnreg.png"
    result = out / "a.tif.attnreg.npz"
    assert geo.is_file() and figure.is_file()
    capsys.readouterr()
    # redone (another seed) without a GeoJSON and without a figure (the Python batch's
    # figure=None; the command line always makes one)
    from napari_attnreg.batch.items import collect_inputs
    from napari_attnreg.batch.run import run_batch

    run_batch(collect_inputs([src]), out, "demo", None,
              {"n_boot": 4, "device": "cpu", "seed": 9}, quiet=True, figure=None)
    err = capsys.readouterr().err
    assert _statuses(out) == ["done"]
    # the tool's GeoJSON now describes the new result and is still the tool's ...
    assert f"rewrote {geo}" in err and owns(result, "geojson", geo)
    from napari_attnreg.io.geojson import write_geojson

    write_geojson(tmp_path / "expected.geojson", AttentionResult.load(result))
    assert geo.read_bytes() == (tmp_path / "expected.geojson").read_bytes()
    # ... and its figure of the replaced result is gone, not left beside the new one
    assert not figure.exists() and f"removed {figure}" in err
    # a later run asking for the GeoJSON finds the tool's own, current: nothing to ask
    run_batch(collect_inputs([src]), out, "demo", None,
              {"n_boot": 4, "device": "cpu", "seed": 9}, quiet=True, figure=None,
              geojson=True)
    err = capsys.readouterr().err
    assert _statuses(out) == ["skipped (exists)"] and "--overwrite" not in err
    assert geo.read_bytes() == (tmp_path / "expected.geojson").read_bytes()


def test_a_figure_that_fails_to_draw_fails_its_image_not_the_batch(tmp_path, capsys):
    from napari_attnreg.batch.items import collect_inputs
    from napari_attnreg.batch.run import run_batch

    for name, seed in (("a.tif", 1), ("b.tif", 2)):
        tifffile.imwrite(tmp_path / name, _img(seed))

    def figure(result, display, path, title):
        if "a.tif" in str(path):
            raise TypeError("Invalid shape (64, 64, 2) for image data")
        Image.fromarray(np.zeros((4, 4), np.uint8)).save(path)
        return path

    out = tmp_path / "out"
    run_batch(collect_inputs([tmp_path / "a.tif", tmp_path / "b.tif"]), out, "demo", None,
              {"n_boot": 4, "device": "cpu"}, quiet=True, figure=figure)
    assert _statuses(out) == ["failed: Unexpected TypeError: Invalid shape (64, 64, 2) for "
                              "image data (details in the log)", "done"]
    assert "Traceback" in capsys.readouterr().err  # the fault's own report, for a bug report


# ---- 3. --level with --mpp: once, before any file -------------------------------------------
def test_level_and_mpp_together_are_refused_before_any_file(tmp_path, capsys):
    with pytest.raises(ValueError, match="slide level or a resolution .*not both"):
        RunConfig(level=1, mpp=1.0).validate()
    with pytest.raises(ValueError, match="not both"):  # whatever the run recorded
        RunConfig(level=1, mpp=1.0, extra={"slide_level": 1}).validate()
    for bad in (math.nan, math.inf, 0.0, -1.0):
        with pytest.raises(ValueError, match="mpp"):
            RunConfig(mpp=bad).validate()
    a, b, out = tmp_path / "a.tif", tmp_path / "b.tif", tmp_path / "out"
    tifffile.imwrite(a, _img(1))
    tifffile.imwrite(b, _img(2))
    assert main(["run", str(a), str(b), "--level", "1", "--mpp", "1", "--out", str(out),
                 *FAST]) == 2
    err = capsys.readouterr().err
    assert err.count("not both") == 1 and "Traceback" not in err
    assert not (out / "summary.csv").exists()


# ---- 4. a tissue mask on an untiled run -----------------------------------------------------
def test_a_tissue_mask_on_an_untiled_run_is_refused(tmp_path, capsys):
    mask = tmp_path / "mask.png"
    _mask(mask, slice(0, 8))
    for value in ("auto", str(mask), np.ones((4, 4), bool)):
        with pytest.raises(ValueError, match="tissue mask applies to tiled runs.*tiled=True"):
            RunConfig(tissue_mask=value).validate()
    RunConfig(tissue_mask="none").validate()  # no mask: what an untiled run does anyway
    RunConfig(tissue_mask=None).validate()
    RunConfig(tiled=True, tissue_mask=str(mask)).validate()
    # the GUIs send a disabled (untiled) control's value as unset, whatever it shows
    for shown in ("auto", "none", "my layer", str(mask)):
        sent = reset_inapplicable({"tiled": False, "tissue_mask": shown})
        assert sent["tissue_mask"] is None
        RunConfig(**sent).validate()
    src, out = tmp_path / "a.tif", tmp_path / "out"
    tifffile.imwrite(src, _img(1))
    assert main(["run", str(src), "--tissue-mask", str(mask), "--out", str(out), *FAST]) == 2
    err = capsys.readouterr().err
    assert "--tiled" in err and err.count("\n") == 1
    assert not (out / "summary.csv").exists()


# the slide and the napari dock on it, as tests/test_slides.py makes them
slide = test_slides.slide
slide_dock = test_slides.slide_dock


@pytest.mark.gui
def test_the_dock_still_runs_a_slide_at_a_resolution_and_untiled_with_mask_text(slide_dock,
                                                                               qtbot):
    # the dock's slide run records the level its --mpp chose beside the mpp (slide_run):
    # that is no "level and mpp" conflict; an untiled run sends a disabled mask as unset
    viewer, widget, layer = slide_dock
    controls = widget.options.controls
    controls["tiled"].setChecked(True)
    controls["mpp"].setValue(1.0)
    md = test_slides._dock_run(widget, qtbot).results[()].metadata
    assert md["slide_level"] == 2 and md["mpp"] == 1.0
    controls["tiled"].setChecked(False)
    controls["mpp"].setValue(controls["mpp"].minimum())  # "auto": unset
    controls["tissue_mask"].setText("auto")
    controls["level"].setValue(2)
    assert test_slides._dock_run(widget, qtbot).results[()].metadata.get("tissue_mask") is None


def test_a_weights_folder_is_fingerprinted_by_its_files_content(tmp_path):
    # --weights may name a transformers folder: a file replaced inside it changes the run
    from napari_attnreg.batch.resume import model_identity

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}", encoding="utf-8")
    (folder / "model.safetensors").write_bytes(b"weights one")
    spec = ModelSpec("file", str(folder), arch="hf:some/model")
    before = model_identity(spec)
    (folder / "model.safetensors").write_bytes(b"weights two")
    assert model_identity(spec) != before
