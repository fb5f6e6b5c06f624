"""Batch runs from the command line: names that never collide, folders, globs, resume,
bad files, summary.csv, figures at display resolution."""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

import numpy as np
import pytest
import tifffile

from napari_attnreg import AttentionResult, regularize
from napari_attnreg.batch.figure import figure_view
from napari_attnreg.batch.items import BatchItem, collect_inputs, output_path
from napari_attnreg.cli import main

FAST = ["--model", "demo", "--n-boot", "4", "--device", "cpu", "--quiet"]


def _img(seed: int, shape=(64, 64)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = 300 + 40 * rng.standard_normal(shape)
    img[20:30, 20:30] += 2000 + 100 * seed
    return img.astype(np.uint16)


def _outputs(out) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*.attnreg.npz"))


def _summary(out) -> list[dict]:
    with open(out / "summary.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_same_names_and_planes_never_share_an_output(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    tifffile.imwrite(tmp_path / "a" / "same.tif", _img(1))
    tifffile.imwrite(tmp_path / "b" / "same.tif", _img(2))
    tifffile.imwrite(tmp_path / "a" / "img.tif", np.stack([_img(3), _img(4)]))  # a 2-plane stack
    tifffile.imwrite(tmp_path / "a" / "img_0.tif", _img(5))
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), *FAST]) == 0
    assert _outputs(out) == ["a/img.tif/plane_0000.attnreg.npz", "a/img.tif/plane_0001.attnreg.npz",
                             "a/img_0.tif.attnreg.npz", "a/same.tif.attnreg.npz",
                             "b/same.tif.attnreg.npz"]
    a = AttentionResult.load(out / "a" / "same.tif.attnreg.npz")
    b = AttentionResult.load(out / "b" / "same.tif.attnreg.npz")
    assert a.metadata["source"].endswith(os.path.join("a", "same.tif"))
    assert b.metadata["source"].endswith(os.path.join("b", "same.tif"))
    assert not np.array_equal(a.attention, b.attention)
    plane = AttentionResult.load(out / "a" / "img.tif" / "plane_0001.attnreg.npz")
    assert plane.metadata["plane"] == "1"
    assert (out / "a" / "img.tif" / "plane_0001.attnreg.png").is_file()


def test_folders_recursive_and_globs(tmp_path):
    import imageio.v3 as iio

    (tmp_path / "d" / "sub").mkdir(parents=True)
    tifffile.imwrite(tmp_path / "d" / "top.tif", _img(1))
    tifffile.imwrite(tmp_path / "d" / "sub" / "deep.tif", _img(2))
    iio.imwrite(tmp_path / "d" / "pic.png", (_img(3) // 256).astype(np.uint8))
    (tmp_path / "d" / "notes.txt").write_text("not an image")

    def names(items):
        return sorted(str(i.relative) for i in items)

    assert names(collect_inputs([tmp_path / "d"])) == ["pic.png", "top.tif"]
    assert names(collect_inputs([tmp_path / "d"], recursive=True)) == [
        "pic.png", os.path.join("sub", "deep.tif"), "top.tif"]
    assert names(collect_inputs([str(tmp_path / "d" / "*.tif")])) == ["top.tif"]
    assert names(collect_inputs([str(tmp_path / "d" / "**" / "*.tif")], recursive=True)) == [
        os.path.join("sub", "deep.tif"), "top.tif"]
    with pytest.raises(ValueError, match="No image files found"):
        collect_inputs([str(tmp_path / "d" / "*.jpg")])
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "d"), "--recursive", "--out", str(out), *FAST]) == 0
    assert _outputs(out) == ["pic.png.attnreg.npz", "sub/deep.tif.attnreg.npz",
                             "top.tif.attnreg.npz"]


def test_existing_outputs_are_skipped_unless_overwrite(tmp_path, capsys):
    tifffile.imwrite(tmp_path / "one.tif", _img(1))
    tifffile.imwrite(tmp_path / "two.tif", np.stack([_img(2), _img(3)]))
    out = tmp_path / "out"
    args = ["run", str(tmp_path / "one.tif"), str(tmp_path / "two.tif"), "--out", str(out), *FAST]
    assert main(args) == 0
    first = {p: p.stat().st_mtime_ns for p in out.rglob("*.attnreg.npz")}
    (out / "two.tif" / "plane_0001.attnreg.npz").unlink()  # as if the batch had been killed
    capsys.readouterr()
    assert main(args) == 0
    statuses = {(r["source"].rsplit(os.sep, 1)[-1], r["plane"]): r["status"] for r in _summary(out)}
    assert statuses == {("one.tif", ""): "skipped (exists)", ("two.tif", "0"): "skipped (exists)",
                        ("two.tif", "1"): "done"}
    assert (out / "one.tif.attnreg.npz").stat().st_mtime_ns == first[out / "one.tif.attnreg.npz"]
    assert "1 done, 2 skipped, 0 failed" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    assert {r["status"] for r in _summary(out)} == {"done"}
    assert (out / "one.tif.attnreg.npz").stat().st_mtime_ns != first[out / "one.tif.attnreg.npz"]


def test_a_bad_file_is_reported_and_the_batch_goes_on(tmp_path, capsys):
    (tmp_path / "broken.tif").write_bytes(b"this is not a tiff")
    tifffile.imwrite(tmp_path / "flat.tif", np.full((64, 64), 7, np.uint16))
    tifffile.imwrite(tmp_path / "good.tif", _img(1))
    out = tmp_path / "out"
    code = main(["run", str(tmp_path / "*.tif"), "--out", str(out), *FAST])
    assert code == 1
    err = capsys.readouterr().err
    assert "broken.tif" in err and "flat.tif" in err and "constant" in err
    assert "Traceback" not in err
    assert _outputs(out) == ["good.tif.attnreg.npz"]
    rows = {r["source"].rsplit(os.sep, 1)[-1]: r for r in _summary(out)}
    assert rows["good.tif"]["status"] == "done"
    assert rows["broken.tif"]["status"].startswith("failed: ")
    flat = rows["flat.tif"]["status"]
    assert flat.startswith("failed: ") and "constant" in flat


def test_summary_csv_has_one_row_per_image_and_plane(tmp_path):
    tifffile.imwrite(tmp_path / "s.tif", np.stack([_img(1), _img(2), _img(3)]),
                     photometric="minisblack")
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "s.tif"), "--out", str(out), "--seed", "5", "--preset",
                 "paper", *FAST]) == 0
    rows = _summary(out)
    assert list(rows[0])[:16] == ["source", "plane", "output", "model", "preset", "B", "seed",
                                  "grid", "pi0", "tokens_significant", "fraction_significant",
                                  "p_map", "map", "compute_seconds", "wall_seconds", "status"]
    assert {"weights_sha256", "rule", "q_th", "z_th", "package_version"} <= set(rows[0])
    assert [r["plane"] for r in rows] == ["0", "1", "2"]
    for row in rows:
        res = AttentionResult.load(row["output"])
        sig = res.significant()
        assert row["model"] == "demo" and row["preset"] == "paper" and row["B"] == "4"
        assert row["seed"] == "5" and row["grid"] == "16x16" and row["status"] == "done"
        assert int(row["tokens_significant"]) == int(sig.sum())
        assert float(row["fraction_significant"]) == pytest.approx(sig.mean())
        assert float(row["pi0"]) == pytest.approx(res.pi0)
        assert row["map"] == res.metadata.get("map", "attention")
        assert (row["p_map"] == "") == (res.p_map is None)
        if res.p_map is not None:
            assert float(row["p_map"]) == pytest.approx(res.p_map)
        compute = float(row["compute_seconds"])
        assert compute == pytest.approx(res.metadata["timings"]["total_s"], abs=1e-3)
        assert float(row["wall_seconds"]) >= compute > 0


def test_tiled_from_the_command_line(tmp_path):
    tifffile.imwrite(tmp_path / "big.tif", _img(1, shape=(300, 200)))
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "big.tif"), "--out", str(out), "--tiled",
                 "--tile-overlap", "16", *FAST]) == 0
    res = AttentionResult.load(out / "big.tif.attnreg.npz")
    assert res.metadata["tiled"] and res.metadata["null_scope"] == "image"
    # a TIFF is read tile by tile, at whole patches: 300 x 200 px -> 296 x 200 px, 37 x 25 tokens
    assert res.metadata["read_on_demand"] and res.image_shape == (296, 200)
    assert res.grid_shape == (37, 25) and res.metadata["n_tiles"] == 3 * 2


def test_figure_view_keeps_maps_on_the_display():
    from napari_attnreg.core.results.result import AttentionResult as R

    grid = np.arange(40 * 30, dtype=float).reshape(40, 30)
    maps = dict(z=grid, p=grid, lfdr=grid, posterior=grid, q=grid)
    result = R(attention=grid, maps=maps, pi0=1.0,
               thresholds={}, image_shape=(3000, 2250), model_shape=(320, 240), patch_size=(8, 8))
    display = np.zeros((3000, 2250), np.float32)
    display[:, 1500:] = 1.0  # the right third
    small, shown = figure_view(result, display, max_side=600)
    assert shown.shape == (600, 450) == small.image_shape
    assert small.to_pixels(grid).shape == shown.shape
    # the token column where the bright third begins lands where it begins in the display
    first_bright = int(np.argmax(shown[0] > 0.5))
    assert small.to_pixels(grid)[0, first_bright] % 30 == 20  # token column 20 = pixel 1500
    item = BatchItem(Path("/data/x/y.tif"), Path("x/y.tif"))
    plane_out = output_path(Path("o"), item, (3, 12)).as_posix()
    assert plane_out == "o/x/y.tif/plane_0003_0012.attnreg.npz"
    assert output_path(Path("o"), item, None).as_posix() == "o/x/y.tif.attnreg.npz"


# ---- reading files: one layout rule, file-naming errors (issue #12) ---------------------------
def test_a_text_file_named_png_is_not_a_readable_image(tmp_path):
    from napari_attnreg.io.readers import read_image, read_stack

    fake = tmp_path / "notes.png"
    fake.write_text("hello, not an image")
    for reader in (read_image, read_stack):
        with pytest.raises(ValueError, match=f"{fake}.* is not a readable image"):
            reader(fake)
    broken = tmp_path / "broken.tif"
    broken.write_bytes(b"II*\x00garbage")
    with pytest.raises(ValueError, match=f"{broken}.* is not a readable image"):
        read_stack(broken)


@pytest.mark.parametrize("shape,kw,layout", [
    ((96, 80, 2), {}, ((), 2, False)),                            # 2 channels, not 96 planes
    ((96, 80, 3), {}, ((), 2, True)),
    ((2, 64, 64), {}, ((0,), None, False)),                       # 2 pages: planes
    ((3, 64, 64), {"metadata": {"axes": "ZYX"}}, ((0,), None, False)),
    ((3, 64, 64), {"metadata": {"axes": "CYX"}}, ((), 0, False)),
    ((2, 3, 64, 64), {"metadata": {"axes": "TCYX"}}, ((0,), 1, False)),
    ((4, 64, 64, 3), {"photometric": "rgb"}, ((0,), 3, True)),    # a stack of colour images
])
def test_tiff_layouts_follow_the_file_and_the_plane_rules(tmp_path, shape, kw, layout):
    from napari_attnreg.io.readers import read_stack

    tifffile.imwrite(tmp_path / "x.tif", np.ones(shape, np.uint8), **kw)
    stack = read_stack(tmp_path / "x.tif")
    assert (stack.stack_axes, stack.channel_axis, stack.rgb) == layout


def test_an_unlabelled_three_by_h_by_w_tiff_is_ambiguous_as_in_regularize(tmp_path):
    from napari_attnreg.core.run.images import prepare_image
    from napari_attnreg.io.readers import read_stack

    data = np.random.default_rng(0).integers(0, 255, (3, 96, 80)).astype(np.uint8)
    tifffile.imwrite(tmp_path / "x.tif", data)  # tifffile stores it as planar samples ('SYX')
    with pytest.raises(ValueError, match="ambiguous.*--channel-axis 0.*split the file"):
        read_stack(tmp_path / "x.tif")
    with pytest.raises(ValueError, match="ambiguous"):
        prepare_image(data, patch_size=(8, 8), mean=(0.5,) * 3, std=(0.25,) * 3)
    chosen = read_stack(tmp_path / "x.tif", channel_axis=0)
    assert chosen.planes() == [()] and chosen.read(())[1] == 0


def test_an_animated_gif_is_a_stack_of_frames(tmp_path):
    import imageio.v3 as iio

    from napari_attnreg.io.readers import read_stack

    frames = np.random.default_rng(0).integers(0, 255, (4, 32, 40, 3)).astype(np.uint8)
    iio.imwrite(tmp_path / "a.gif", frames)
    stack = read_stack(tmp_path / "a.gif")
    assert stack.n_planes == 4 and stack.plane_shape == (32, 40) and stack.rgb
    iio.imwrite(tmp_path / "one.gif", frames[0])
    assert read_stack(tmp_path / "one.gif").planes() == [()]  # one frame: one image


def test_output_folder_problems_are_found_before_any_work(tmp_path):
    from napari_attnreg.batch.items import prepare_output_dir

    a_file = tmp_path / "taken"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="is an existing file; give --out a folder"):
        prepare_output_dir(a_file)
    with pytest.raises(ValueError, match="Cannot write results into"):
        prepare_output_dir(a_file / "below")
    assert prepare_output_dir(tmp_path / "new" / "deep").is_dir()


def test_an_unwritable_output_folder_is_refused(tmp_path, monkeypatch):
    import tempfile

    from napari_attnreg.batch.items import prepare_output_dir

    def denied(*args, **kwargs):  # what a read-only folder gives a normal user
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", denied)
    with pytest.raises(ValueError, match="Cannot write results into .*Permission denied.*--out"):
        prepare_output_dir(tmp_path)


def test_sample_images_fail_with_advice(monkeypatch, tmp_path):
    from skimage import data

    from napari_attnreg import samples
    def offline():
        raise ConnectionError("no internet")

    monkeypatch.setattr(data, "retina", offline)
    with pytest.raises(ValueError, match="'retina' could not be loaded.*bundled demo image"):
        samples.skimage_sample("retina")
    with pytest.raises(ValueError, match="Unknown sample 'nope'"):
        samples.skimage_sample("nope")
    monkeypatch.setattr(samples, "DATA_DIR", tmp_path)
    with pytest.raises(ValueError, match="sample mask is missing"):
        samples.demo_mask()


# ---- issue #18: batches and files that never lie ----------------------------------------------
def test_damaged_tiffs_are_per_file_errors_and_the_summary_is_complete(tmp_path, capsys):
    tifffile.imwrite(tmp_path / "good.tif", _img(1))
    tifffile.imwrite(tmp_path / "tiled.tif", np.tile(_img(2), (4, 4)), tile=(64, 64),
                     compression="zlib")
    data = (tmp_path / "tiled.tif").read_bytes()
    (tmp_path / "tiled.tif").write_bytes(data[: len(data) * 2 // 3])  # zlib.error when decoded
    (tmp_path / "four.tif").write_bytes(b"II*\x00")  # struct.error in tifffile
    out = tmp_path / "out"
    assert main(["run", str(tmp_path), "--out", str(out), *FAST]) == 1
    assert "Traceback" not in capsys.readouterr().err
    rows = {Path(r["source"]).name: r["status"] for r in _summary(out)}
    assert rows["good.tif"] == "done" and len(rows) == 3
    for name in ("tiled.tif", "four.tif"):
        assert rows[name].startswith("failed: ") and name in rows[name]
        assert "not a readable image" in rows[name]


def test_resume_never_reports_another_inputs_result_and_keeps_earlier_rows(tmp_path, capsys):
    for folder, seed in (("A", 1), ("B", 2)):
        (tmp_path / folder).mkdir()
        tifffile.imwrite(tmp_path / folder / "img.tif", _img(seed))
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "A" / "img.tif"), "--out", str(out), *FAST]) == 0
    capsys.readouterr()
    assert main(["run", str(tmp_path / "B" / "img.tif"), "--out", str(out), *FAST]) == 1
    err = capsys.readouterr().err
    assert "0 done, 0 skipped, 1 failed" in err and "holds the result of" in err
    held = AttentionResult.load(out / "img.tif.attnreg.npz")
    assert held.metadata["source"] == str((tmp_path / "A" / "img.tif").resolve())
    rows = {Path(r["source"]).parent.name: r["status"] for r in _summary(out)}
    assert rows["A"] == "done" and rows["B"].startswith("failed: ")  # A's row was kept


def test_resume_redoes_what_is_incomplete_or_different_and_says_why(tmp_path, capsys):
    src = tmp_path / "one.tif"
    tifffile.imwrite(src, _img(1))
    out = tmp_path / "out"
    args = ["run", str(src), "--out", str(out), *FAST]
    figure = out / "one.tif.attnreg.png"

    def again(extra=()):
        capsys.readouterr()
        assert main([*args, *extra]) == 0
        return _summary(out)[0]["status"], capsys.readouterr().err

    assert main(args) == 0
    assert again()[0] == "skipped (exists)"
    figure.unlink()  # killed before the figure was written
    status, err = again()
    assert status == "done" and "figure" in err and figure.is_file()
    figure.write_bytes(figure.read_bytes()[:100])  # a truncated figure
    status, err = again()
    assert status == "done" and "figure" in err
    status, err = again(["--seed", "9"])
    assert status == "done" and "options changed" in err and "seed" in err
    tifffile.imwrite(src, _img(2))
    status, err = again(["--seed", "9"])
    assert status == "done" and "input changed" in err
    assert again(["--seed", "9"])[0] == "skipped (exists)"
    (out / "one.tif.attnreg.npz").write_bytes(b"PK\x03\x04 truncated")
    status, err = again(["--seed", "9"])
    assert status == "done" and "result" in err


def test_a_full_disk_during_the_summary_or_a_result_leaves_no_partial_file(tmp_path, monkeypatch):
    import errno

    from napari_attnreg.batch.summary import write_summary

    summary = tmp_path / "summary.csv"
    write_summary([{"source": "a.tif", "status": "done"}], summary)
    before = summary.read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(csv.DictWriter, "writerows", full)
    with pytest.raises(ValueError, match="Cannot write .*summary.csv.*No space left"):
        write_summary([{"source": "b.tif", "status": "done"}], summary)
    assert summary.read_bytes() == before and os.listdir(tmp_path) == ["summary.csv"]
    monkeypatch.setattr(np, "savez_compressed", full)
    grid = np.zeros((4, 4))
    maps = dict(z=grid, p=grid, lfdr=grid, posterior=grid, q=grid)
    result = AttentionResult(attention=grid, maps=maps, pi0=1.0, thresholds={},
                             image_shape=(32, 32), model_shape=(32, 32), patch_size=(8, 8))
    with pytest.raises(OSError):
        result.save(tmp_path / "r.attnreg.npz")
    assert os.listdir(tmp_path) == ["summary.csv"]


def _finishes(fn, seconds: float = 20.0):
    """fn()'s value, failing (not hanging) when it runs longer than ``seconds``."""
    import threading

    box = {}
    worker = threading.Thread(target=lambda: box.setdefault("value", fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s"
    return box["value"]


def test_recursive_inputs_over_symlink_loops_finish_with_each_file_once(tmp_path):
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    tifffile.imwrite(d / "top.tif", _img(1))
    tifffile.imwrite(d / "sub" / "deep.tif", _img(2))
    for name in ("loop_a", "loop_b"):  # two loops: 2**depth paths until ELOOP
        os.symlink(d, d / "sub" / name)
    os.symlink(d / "sub", d / "alias")  # a second way to reach the same real folder

    def names(items):
        return sorted(str(i.source.relative_to(d)) for i in items)

    expected = [os.path.join("sub", "deep.tif"), "top.tif"]
    assert names(_finishes(lambda: collect_inputs([d], recursive=True))) == expected
    pattern = str(d / "**" / "*.tif")
    assert names(_finishes(lambda: collect_inputs([pattern], recursive=True))) == expected


def test_an_output_folder_inside_the_inputs_is_not_analysed(tmp_path, capsys):
    tifffile.imwrite(tmp_path / "img.tif", _img(1))
    out = tmp_path / "out"
    args = ["run", str(tmp_path), "--recursive", "--out", str(out), *FAST]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 0
    assert "0 done, 1 skipped, 0 failed" in capsys.readouterr().err
    assert [Path(r["source"]).name for r in _summary(out)] == ["img.tif"]
    assert main(["run", str(tmp_path / "**" / "*.png"), "--recursive", "--out", str(out),
                 *FAST]) == 2  # only its own figures matched: nothing to do, said clearly


def test_a_write_error_is_that_images_row_and_promises_no_log(tmp_path, monkeypatch, capsys):
    tifffile.imwrite(tmp_path / "img.tif", _img(1))

    def denied(self, path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(AttentionResult, "save", denied)
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "img.tif"), "--out", str(out), *FAST]) == 1
    status = _summary(out)[0]["status"]
    assert status.startswith("failed: ") and "Permission denied" in status
    assert "log" not in status and "log" not in capsys.readouterr().err


def test_a_resume_killed_halfway_keeps_the_earlier_rows_of_images_not_yet_reached(
        tmp_path, monkeypatch):
    from napari_attnreg.batch import run as batch
    for i in range(2):
        tifffile.imwrite(tmp_path / f"img{i}.tif", _img(i))
    items = collect_inputs([tmp_path / "img0.tif", tmp_path / "img1.tif"])
    out = tmp_path / "out"
    opts = {"n_boot": 4, "device": "cpu", "seed": 0}
    batch.run_batch(items, out, "demo", None, opts, quiet=True)
    real = batch.process_item

    def killed_at_the_second(item, *args, **kwargs):
        if item == items[1]:
            raise KeyboardInterrupt
        return real(item, *args, **kwargs)

    monkeypatch.setattr(batch, "process_item", killed_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        batch.run_batch(items, out, "demo", None, {**opts, "seed": 9}, quiet=True)
    rows = {Path(r["source"]).name: r for r in _summary(out)}
    assert sorted(rows) == ["img0.tif", "img1.tif"]
    assert rows["img0.tif"]["seed"] == "9" and rows["img1.tif"]["seed"] == "0"


def test_decoder_failures_name_the_file_and_bugs_outside_decoding_still_surface(tmp_path):
    from napari_attnreg.core.files import UnreadableFileError, decoding

    path = tmp_path / "x.tif"
    for raised in (KeyError("StripOffsets"), ZeroDivisionError(), MemoryError()):
        with pytest.raises(UnreadableFileError, match=str(path)) as info:
            with decoding(path):
                raise raised
        assert info.value.__cause__ is raised
    with pytest.raises(KeyboardInterrupt):  # not an Exception: a Ctrl-C is never a file error
        with decoding(path):
            raise KeyboardInterrupt


# ---- issue #16: one run path ------------------------------------------------------------------
def _spy_on_the_service(monkeypatch) -> tuple[list, list]:
    """Every Job the pipeline service runs, and every engine run it starts, as they happen."""
    from napari_attnreg.core.run import service

    jobs, engine_runs = [], []
    real_job, real_engine = service.run_job, service.run_engine

    def counting_job(job, cancel=None):
        jobs.append(job)
        return real_job(job, cancel)

    def counting_engine(*args, **kwargs):
        engine_runs.append(args[2].extra)
        return real_engine(*args, **kwargs)

    monkeypatch.setattr(service, "run_job", counting_job)
    monkeypatch.setattr(service, "run_engine", counting_engine)
    return jobs, engine_runs


def test_the_serial_batch_runs_every_plane_through_the_pipeline_service(tmp_path, monkeypatch,
                                                                          capsys):
    from napari_attnreg.core.run.service import user_message

    jobs, engine_runs = _spy_on_the_service(monkeypatch)
    tifffile.imwrite(tmp_path / "one.tif", _img(1))
    tifffile.imwrite(tmp_path / "two.tif", np.stack([_img(2), _img(3)]))
    tifffile.imwrite(tmp_path / "flat.tif", np.full((64, 64), 7, np.uint16))
    out = tmp_path / "out"
    args = ["run", str(tmp_path / "*.tif"), "--out", str(out), *FAST]
    assert main(args) == 1
    ran = sorted((Path(job.config.extra["source"]).name, job.planes) for job in jobs)
    assert ran == [("flat.tif", [()]), ("one.tif", [()]), ("two.tif", [(0,)]), ("two.tif", [(1,)])]
    assert all(job.keep_display for job in jobs)  # the figure's image comes back from the service
    # the engine ran inside those jobs, once per result (the flat image fails when prepared)
    assert sorted((Path(extra["source"]).name, extra["plane"]) for extra in engine_runs) == [
        ("one.tif", ""), ("two.tif", "0"), ("two.tif", "1")]
    rows = {(Path(r["source"]).name, r["plane"]): r["status"] for r in _summary(out)}
    assert rows[("two.tif", "1")] == "done" and (out / "two.tif" / "plane_0001.attnreg.png").is_file()
    jobs.clear()
    capsys.readouterr()
    assert main(args) == 1  # resumed: the kept outputs start no job, the failed file is retried
    assert [Path(job.config.extra["source"]).name for job in jobs] == ["flat.tif"]
    assert "0 done, 3 skipped, 1 failed" in capsys.readouterr().err
    with pytest.raises(ValueError) as constant:  # the batch's reason is the service's message
        regularize(np.full((64, 64), 7, np.uint16), "demo", n_boot=4, device="cpu")
    assert rows[("flat.tif", "")] == f"failed: {user_message(constant.value)}"


def test_resume_redoes_inputs_whose_bytes_changed_with_the_same_size_and_mtime(tmp_path, capsys):
    a, b = tmp_path / "a.tif", tmp_path / "b.tif"
    tifffile.imwrite(a, _img(1))
    tifffile.imwrite(b, _img(2))
    assert a.stat().st_size == b.stat().st_size
    out = tmp_path / "out"
    args = ["run", str(a), str(b), "--out", str(out), *FAST]
    assert main(args) == 0
    times = {p: (p.stat().st_atime_ns, p.stat().st_mtime_ns) for p in (a, b)}
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)  # swapped, as cp -p / rsync -t / tar would leave them
    b.write_bytes(data_a)
    for p, ns in times.items():
        os.utime(p, ns=ns)
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert [r["status"] for r in _summary(out)] == ["done", "done"]
    assert err.count("the input changed since (content)") == 2
    redone = AttentionResult.load(out / "a.tif.attnreg.npz")
    direct = AttentionResult.load(out / "b.tif.attnreg.npz")
    assert not np.array_equal(redone.attention, direct.attention)


def test_content_digest_samples_blocks_of_large_inputs(tmp_path, monkeypatch):
    from napari_attnreg.batch import resume

    path = tmp_path / "big.raw"
    data = bytearray(os.urandom(1 << 20))
    path.write_bytes(data)
    whole = resume.content_digest([path])
    monkeypatch.setattr(resume, "WHOLE_HASH_BYTES", 1 << 16)
    sampled = resume.content_digest([path])
    assert sampled != whole  # says which way it was made
    data[-1] ^= 0xFF  # the last block is always sampled
    path.write_bytes(data)
    last_changed = resume.content_digest([path])
    assert last_changed != sampled
    data[0] ^= 0xFF  # and the first
    path.write_bytes(data)
    assert resume.content_digest([path]) not in (sampled, last_changed)


def test_a_second_batch_into_the_same_folder_is_refused_and_a_dead_holders_lock_taken_over(
        tmp_path, capsys):
    import subprocess
    import sys

    from napari_attnreg.batch.summary import LOCK_NAME, FolderLock

    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; "
         "from napari_attnreg.batch.summary import FolderLock; "
         f"lock = FolderLock(Path({str(out)!r})).acquire(); print('locked', flush=True); "
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        src = tmp_path / "a.tif"
        tifffile.imwrite(src, _img(1))
        assert main(["run", str(src), "--out", str(out), *FAST]) == 2
        err = capsys.readouterr().err
        assert f"process {holder.pid}" in err and "Another batch" in err
        assert err.count("\n") == 1 and not (out / "summary.csv").exists()
    finally:
        holder.kill()  # like kill -9: no chance to tidy up
        holder.wait()
    assert (out / LOCK_NAME).read_text().strip().startswith(f"process {holder.pid}")
    with FolderLock(out):  # the dead holder's file locks nothing
        with pytest.raises(ValueError, match=f"process {os.getpid()}"):
            FolderLock(out).acquire()  # while held, even within one process
    assert not (out / LOCK_NAME).exists()  # a batch that ends leaves no lock file
    assert main(["run", str(src), "--out", str(out), *FAST]) == 0
    assert [r["status"] for r in _summary(out)] == ["done"]
    assert not (out / LOCK_NAME).exists()


@pytest.mark.parametrize("content", [b"sample,condition,score\nx,1,0.5\n",
                                     b"\xff\xfe\x00garbage\x00\x81"])
def test_a_foreign_summary_csv_in_the_output_folder_is_never_overwritten(tmp_path, capsys,
                                                                         content):
    src = tmp_path / "a.tif"
    tifffile.imwrite(src, _img(1))
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.csv").write_bytes(content)
    assert main(["run", str(src), "--out", str(out), *FAST]) == 2
    err = capsys.readouterr().err
    assert str(out / "summary.csv") in err and "Move it away" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (out / "summary.csv").read_bytes() == content
    assert not list(out.rglob("*.attnreg.npz"))


def test_an_unreadable_file_named_like_an_output_is_refused_not_overwritten(tmp_path, capsys):
    a, b = tmp_path / "a.tif", tmp_path / "b.tif"
    tifffile.imwrite(a, _img(1))
    tifffile.imwrite(b, _img(2))
    out = tmp_path / "out"
    out.mkdir()
    theirs = out / "a.tif.attnreg.npz"
    theirs.write_bytes(b"my own notes, not a result")
    assert main(["run", str(a), str(b), "--out", str(out), *FAST]) == 1
    err = capsys.readouterr().err
    rows = {Path(r["source"]).name: r["status"] for r in _summary(out)}
    assert rows["b.tif"] == "done"
    assert rows["a.tif"].startswith("failed: ") and "not a napari-attnreg result" in rows["a.tif"]
    assert str(theirs) in err and theirs.read_bytes() == b"my own notes, not a result"
    assert main(["run", str(a), "--out", str(out), "--overwrite", *FAST]) == 0  # when asked
    assert AttentionResult.load(theirs).metadata["source"] == str(a.resolve())


def test_summary_has_p_map_and_the_terminal_lists_every_output(tmp_path, capsys):
    src = tmp_path / "a.tif"
    tifffile.imwrite(src, _img(1))
    out = tmp_path / "out"
    assert main(["run", str(src), "--out", str(out), *FAST]) == 0
    stdout = capsys.readouterr().out
    assert f"-> {out.resolve() / 'a.tif.attnreg.npz'}" in stdout
    assert f"-> {out.resolve() / 'a.tif.attnreg.png'}" in stdout
    row = _summary(out)[0]
    res = AttentionResult.load(row["output"])
    assert res.p_map is not None and float(row["p_map"]) == pytest.approx(res.p_map)
    assert row["map"] == "attention"
    printed = re.search(r"([0-9.]+) s on cpu", stdout).group(1)
    assert float(row["compute_seconds"]) == pytest.approx(float(printed), abs=0.051)
    assert main(["run", str(src), "--out", str(out), *FAST]) == 0
    kept = _summary(out)[0]
    assert kept["status"] == "skipped (exists)" and kept["wall_seconds"] == ""
    assert kept["compute_seconds"] == row["compute_seconds"] and kept["p_map"] == row["p_map"]


def test_a_class_map_of_a_model_without_a_head_stops_the_batch_once(tmp_path, blob_image):
    """A foundation model (no classification head) given map='gradcam' and no concept failed
    every image of a folder alike, one 'failed' row each; the batch now stops at its first
    image with the one message, which names the command line's --concept."""
    import timm
    import torch

    from napari_attnreg.cli import run_files
    from napari_attnreg.core.models.backbones import load_backbone

    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(3):
        tifffile.imwrite(folder / f"field{i}.tif", blob_image)
    out = tmp_path / "out"
    torch.manual_seed(0)
    headless = load_backbone(timm.create_model("vit_tiny_patch16_224", pretrained=False,
                                               depth=2, num_classes=0))
    with pytest.raises(ValueError, match=r"no classification head.*--concept FILE"):
        run_files([folder], out, headless, None,
                  {"map": "gradcam", "n_boot": 4, "device": "cpu", "seed": 0}, quiet=True)
    assert not list(out.glob("*.npz")) and not list(out.glob("*.zarr"))
