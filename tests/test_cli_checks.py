"""Issue #17 on the command line: a resume redoes what other options would change, options and
the device are checked once before anything loads, a finished batch never loads the model,
and the image's kind is weighed against the model's domain."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import tifffile

from napari_attnreg import AttentionResult
from napari_attnreg.cli import main

FAST = ["--n-boot", "4", "--quiet"]


def _img(seed: int = 1, shape=(64, 64)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = 300 + 40 * rng.standard_normal(shape)
    img[20:30, 20:30] += 2000
    return img.astype(np.uint16)


def _statuses(out) -> list[str]:
    with open(out / "summary.csv", newline="") as fh:
        return [row["status"] for row in csv.DictReader(fh)]


@pytest.fixture
def model_loads(monkeypatch):
    """Every request for a model in this process (cached or not): the service's cache is the
    one door to a model, for the batch and for the jobs it runs."""
    from napari_attnreg.core.run import service

    asked = []
    real = service._CACHE.get

    def spy(spec):
        asked.append(spec)
        return real(spec)

    monkeypatch.setattr(service._CACHE, "get", spy)
    return asked


def _again(capsys, argv) -> tuple[int, str]:
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err


def test_demo_resume_redoes_the_output_when_the_preset_changes(tmp_path, capsys):
    out = tmp_path / "out"
    demo = ["demo", "--out", str(out), *FAST]
    assert main(demo) == 0
    figure = next(out.glob("*.attnreg.png"))
    before = figure.read_bytes()
    code, err = _again(capsys, [*demo, "--preset", "paper"])
    assert code == 0 and "0 skipped" in err
    assert "redoing it: the options changed (preset)" in err  # the cause, not a dozen defaults
    assert figure.read_bytes() != before  # the old figure is not left behind
    assert AttentionResult.load(next(out.glob("*.attnreg.npz"))).preset == "paper"
    # stating the preset's own default is no change; nor is how the work is cut up
    code, err = _again(capsys, [*demo, "--preset", "paper", "--p-th", "0.3", "--chunk-size", "3"])
    assert code == 0 and "0 done, 1 skipped" in err
    code, err = _again(capsys, [*demo, "--preset", "paper", "--head", "1"])
    assert "the options changed (head)" in err and "1 done" in err


def test_run_resume_covers_every_option_the_model_and_the_stated_kind(tmp_path, capsys):
    import imageio.v3 as iio

    iio.imwrite(tmp_path / "a.png", (_img() // 256).astype(np.uint8))
    out = tmp_path / "out"
    run = ["run", str(tmp_path / "a.png"), "--out", str(out), "--model", "demo", *FAST]
    assert main(run) == 0
    for extra, changed in ((["--target-size", "native"], "target_size"),
                           (["--target-size", "native", "--merge", "max"], "merge"),
                           (["--target-size", "native", "--merge", "max", "--model", "phantom"],
                            "model, weights_sha256"),
                           (["--target-size", "native", "--merge", "max", "--model", "phantom",
                             "--image-kind", "radiology"], "image_kind")):
        code, err = _again(capsys, [*run, *extra])
        assert code == 0 and f"the options changed ({changed})" in err, err
        code, err = _again(capsys, [*run, *extra])
        assert "0 done, 1 skipped" in err  # and now it is kept
    record = (out / "a.png.attnreg.json").read_text()
    assert '"weights_sha256": "' in record and '"q_th": 0.1' in record  # resolved, hashed


def test_a_bad_device_or_option_is_one_error_before_any_model_or_image(tmp_path, capsys,
                                                                        model_loads):
    import torch

    for k in range(3):
        tifffile.imwrite(tmp_path / f"img{k}.tif", _img(k))
    out = tmp_path / "out"
    run = ["run", str(tmp_path), "--out", str(out), "--model", "demo", *FAST]
    bad = [["--device", "cuda:7"], ["--preset", "paper", "--null-pool", "position"]]
    if not torch.cuda.is_available():
        bad.append(["--device", "cuda"])  # a CPU-only machine: the case
    for argv in bad:
        code, err = _again(capsys, [*run, *argv])
        assert code == 2, argv
        assert err.count("attnreg: error:") == 1 and "Traceback" not in err
        assert model_loads == [] and not (out / "summary.csv").exists()
    code, err = _again(capsys, ["demo", "--out", str(out), "--device", "cuda:7"])
    assert code == 2 and "cuda:7" in err and model_loads == []


def test_a_batch_whose_outputs_are_all_complete_never_loads_the_model(tmp_path, capsys,
                                                                       model_loads):
    tifffile.imwrite(tmp_path / "one.tif", _img(1))
    tifffile.imwrite(tmp_path / "stack.tif", np.stack([_img(2), _img(3)]))
    out = tmp_path / "out"
    run = ["run", str(tmp_path / "*.tif"), "--out", str(out), "--model", "demo", *FAST]
    assert main(run) == 0 and model_loads  # the first run needs it
    model_loads.clear()
    code, err = _again(capsys, run)
    assert code == 0 and "0 done, 3 skipped, 0 failed" in err
    assert model_loads == [] and "model:" not in err
    assert _statuses(out) == ["skipped (exists)"] * 3


def test_the_images_kind_against_the_models_domain(tmp_path, capsys):
    """A stated kind is recorded and warned about once in the summary, once in the figure
    title; without one a plain PNG says nothing about its kind."""
    import imageio.v3 as iio

    iio.imwrite(tmp_path / "a.png", (_img() // 256).astype(np.uint8))
    run = ["run", str(tmp_path / "a.png"), "--model", "demo", *FAST]
    assert main([*run, "--out", str(tmp_path / "auto")]) == 0
    plain = AttentionResult.load(tmp_path / "auto" / "a.png.attnreg.npz")
    assert plain.metadata.get("image_kind") is None
    assert "off_domain" not in [d.code for d in plain.diagnostics]
    assert main([*run, "--out", str(tmp_path / "ct"), "--image-kind", "radiology"]) == 0
    stated = AttentionResult.load(tmp_path / "ct" / "a.png.attnreg.npz")
    assert stated.metadata["image_kind"] == "radiology"
    assert stated.metadata["image_kind_source"] == "stated"
    (finding,) = [d for d in stated.diagnostics if d.code == "off_domain"]
    assert finding.severity == "warning" and "test article" in finding.message
    assert capsys.readouterr().out.count("test article") == 1


def test_a_resume_remakes_outputs_an_earlier_reading_of_the_file_made(tmp_path, capsys):
    """Results of a PNG or a DICOM made before they were read as a viewer shows them (a
    MONOCHROME1 negative, a CMYK JPEG's inks, colours under alpha 0) were kept by a resume
    as complete; a TIFF, whose reading did not change, keeps its output."""
    import json

    import imageio.v3 as iio

    iio.imwrite(tmp_path / "a.png", (_img() // 256).astype(np.uint8))
    tifffile.imwrite(tmp_path / "b.tif", _img(2))
    out = tmp_path / "out"
    run = ["run", str(tmp_path / "a.png"), str(tmp_path / "b.tif"), "--out", str(out), *FAST]
    assert main(run) == 0
    for record in out.glob("*.attnreg.json"):  # as an earlier version wrote them
        content = json.loads(record.read_text())
        content["input"].pop("reading", None)
        record.write_text(json.dumps(content))
    code, err = _again(capsys, run)
    assert code == 0 and "1 done, 1 skipped" in err
    assert "a.png: redoing it: this version of napari-attnreg reads such files differently" \
        in err
    code, err = _again(capsys, run)  # its new record is kept from then on
    assert code == 0 and "0 done, 2 skipped" in err


def test_a_resume_after_an_upgrade_redoes_only_the_files_whose_reading_changed(tmp_path,
                                                                               capsys):
    """A new option (the intensity window) missing from every older record made a resume redo
    every output ("the options changed (intensity_window)"), though at its default it computes
    what the old version did for a PNG or a grey TIFF. The files it does change (a DICOM with
    a stored window, now analysed through it) and the TIFFs now read in colour (palette,
    planar RGB) are redone, with the reason."""
    import json

    import imageio.v3 as iio
    from test_io_readers import write_ct_slice

    rng = np.random.default_rng(3)
    iio.imwrite(tmp_path / "a.png", (_img() // 256).astype(np.uint8))
    tifffile.imwrite(tmp_path / "b.tif", _img(2))
    table = np.zeros((3, 256), np.uint16)
    table[:, :4] = rng.integers(0, 65535, (3, 4))
    tifffile.imwrite(tmp_path / "c.tif", rng.integers(0, 4, (64, 64), dtype=np.uint8),
                     photometric="palette", colormap=table)
    write_ct_slice(tmp_path / "d.dcm", 0.0, 1, rng.integers(900, 1200, (64, 64)))
    out = tmp_path / "out"
    run = ["run", *(str(tmp_path / n) for n in ("a.png", "b.tif", "c.tif", "d.dcm")),
           "--out", str(out), *FAST]
    assert main(run) == 0
    for record in out.glob("*.attnreg.json"):  # as the version before the window wrote them
        content = json.loads(record.read_text())
        del content["run"]["intensity_window"]
        if content["input"].get("reading") == 3:
            if content["input"]["source"].endswith(".dcm"):
                content["input"]["reading"] = 2
            else:
                del content["input"]["reading"]  # TIFFs carried no reading
        record.write_text(json.dumps(content))
    code, err = _again(capsys, run)
    assert code == 0 and "2 done, 2 skipped" in err, err
    for name in ("c.tif", "d.dcm"):
        assert f"{name}: redoing it: this version of napari-attnreg reads such files " \
               "differently" in err
    assert "intensity_window" not in err
    code, err = _again(capsys, ["run", str(tmp_path / "a.png"), "--out", str(out), *FAST,
                                "--intensity-window", "percentiles"])
    assert code == 0 and "the options changed (intensity_window)" in err  # a choice counts


def test_another_figure_kind_redoes_the_output_instead_of_keeping_the_old_png(tmp_path,
                                                                              capsys):
    """A folder run with --figure overview, rerun for publication figures: every image was
    'skipped (exists)' and kept its overview PNG."""
    import imageio.v3 as iio

    iio.imwrite(tmp_path / "a.png", (_img() // 256).astype(np.uint8))
    run = ["run", str(tmp_path / "a.png"), "--out", str(tmp_path / "out"), "--model", "demo",
           *FAST]
    png = tmp_path / "out" / "a.png.attnreg.png"
    assert main([*run, "--figure", "overview"]) == 0
    height, width = iio.imread(png).shape[:2]
    assert width > 2.5 * height  # the overview: five panels side by side
    code, err = _again(capsys, run)  # the default: publication
    assert code == 0 and "the options changed (figure)" in err and "1 done" in err, err
    height, width = iio.imread(png).shape[:2]
    assert width < 2 * height  # the publication figure: the image and its key
    code, err = _again(capsys, run)
    assert "0 done, 1 skipped" in err  # and now it is kept
