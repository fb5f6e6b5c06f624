"""The attnreg command: files in, one result file and one figure per image/plane out."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile
import timm
import torch
from safetensors.torch import save_file

from napari_attnreg import AttentionResult
from napari_attnreg.cli import main


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    torch.manual_seed(0)
    module = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=12)
    path = tmp_path_factory.mktemp("w") / "tiny.safetensors"
    save_file(module.state_dict(), str(path))
    return path


def test_run_on_tiff_stack_and_png(tmp_path, weights, blob_image, capsys):
    import imageio.v3 as iio

    stack = np.stack([blob_image, blob_image[::-1]])
    tifffile.imwrite(tmp_path / "stack.tif", stack)
    rgb = np.repeat((blob_image // 256).astype(np.uint8)[..., None], 3, axis=-1)
    iio.imwrite(tmp_path / "rgb.png", rgb)
    out = tmp_path / "out"
    code = main(["run", str(tmp_path / "stack.tif"), str(tmp_path / "rgb.png"), "--model", str(weights),
                 "--arch", "vit_tiny_patch16_224", "--n-boot", "6", "--out", str(out), "--quiet",
                 "--device", "cpu", "--preset", "directional", "--rule", "p", "--p-th", "0.2"])
    assert code == 0
    names = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    # per output: the result, its figure and the resume record written last (#18)
    assert names == ["rgb.png.attnreg.json", "rgb.png.attnreg.npz", "rgb.png.attnreg.png",
                     "stack.tif/plane_0000.attnreg.json", "stack.tif/plane_0000.attnreg.npz",
                     "stack.tif/plane_0000.attnreg.png", "stack.tif/plane_0001.attnreg.json",
                     "stack.tif/plane_0001.attnreg.npz", "stack.tif/plane_0001.attnreg.png",
                     "summary.csv"]
    res = AttentionResult.load(out / "stack.tif" / "plane_0001.attnreg.npz")
    assert res.image_shape == blob_image.shape and res.metadata["n_boot"] == 6
    # the directional default: no z mask, its own l_th/q_th; the explicit rule and p_th win
    assert res.thresholds == {"rule": "p", "z_th": None, "p_th": 0.2, "l_th": 0.2, "q_th": 0.1}
    assert res.preset == "directional" and res.metadata["preset"] == "directional"
    assert res.metadata["source"].endswith("stack.tif") and res.metadata["plane"] == "1"
    assert (out / "rgb.png.attnreg.png").stat().st_size > 10_000
    assert "grid" in capsys.readouterr().out


def test_errors_are_one_clear_line(tmp_path, weights, capsys):
    # nothing to run: one line at once, exit 2
    assert main(["run", str(tmp_path / "missing.tif"), "--model", str(weights),
                 "--arch", "vit_tiny_patch16_224", "--out", str(tmp_path / "o")]) == 2
    assert "No such file or folder" in capsys.readouterr().err
    # a bad input among others is that input's failure (exit 1 at the end)
    tifffile.imwrite(tmp_path / "ok.tif", np.random.default_rng(0).integers(0, 999, (64, 64)))
    assert main(["run", str(tmp_path / "missing.tif"), str(tmp_path / "ok.tif"), "--model",
                 str(weights), "--arch", "vit_tiny_patch16_224", "--n-boot", "4", "--quiet",
                 "--out", str(tmp_path / "o")]) == 1
    assert "No such image file" in capsys.readouterr().err
    tifffile.imwrite(tmp_path / "flat.tif", np.full((64, 64), 5, np.uint16))
    assert main(["run", str(tmp_path / "flat.tif"), "--model", str(weights), "--n-boot", "4",
                 "--arch", "vit_tiny_patch16_224", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "constant" in err and "Traceback" not in err
    assert main(["run", str(tmp_path / "flat.tif"), "--model", str(weights)]) == 2
    assert "arch" in capsys.readouterr().err


def test_demo_command_runs_offline(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--n-boot", "6", "--quiet", "--device", "cpu"]) == 0
    results = sorted(tmp_path.glob("*.attnreg.npz"))
    assert len(results) == 1 and results[0].with_suffix(".png").exists()
    res = AttentionResult.load(results[0])
    assert res.metadata["n_boot"] == 6 and res.preset == "stepdown"
    from napari_attnreg.core.models.backbones import DEMO_DIR

    if (DEMO_DIR / "demo_vit.safetensors").is_file():
        assert res.metadata["model"] == "demo" and not res.metadata["random_init"]
    else:  # a checkout without the trained files must say plainly that the weights are random
        assert res.metadata["random_init"]
        assert "RANDOM weights" in capsys.readouterr().err


def test_paper_preset_from_the_command_line(tmp_path, weights):
    """--preset paper gives the published defaults; mixing it with directional-only options
    is one clear line, not a traceback."""
    tifffile.imwrite(tmp_path / "img.tif", (np.random.default_rng(0).random((64, 64)) * 999)
                     .astype(np.uint16))
    common = ["run", str(tmp_path / "img.tif"), "--model", str(weights), "--arch",
              "vit_tiny_patch16_224", "--n-boot", "6", "--quiet", "--device", "cpu"]
    assert main([*common, "--preset", "paper", "--out", str(tmp_path / "paper")]) == 0
    res = AttentionResult.load(tmp_path / "paper" / "img.tif.attnreg.npz")
    assert res.preset == "paper"
    assert res.thresholds == {"rule": "lfdr", "z_th": 0.0, "p_th": 0.3, "l_th": 0.3, "q_th": 0.1}
    assert res.metadata["p_method"] == "pooled" and res.metadata["pi0_method"] == "reference"
    assert main([*common, "--preset", "paper", "--null-pool", "position",
                 "--out", str(tmp_path / "bad")]) == 2
    assert main([*common, "--alternative", "two-sided", "--out", str(tmp_path / "bad")]) == 2


def test_help_and_version_answer_without_importing_torch():
    import subprocess
    import sys

    import napari_attnreg

    code = ("import sys\nfrom napari_attnreg.cli import main\n"
            "for argv in (['--help'], ['run', '--help'], ['--version']):\n"
            "    try:\n        main(argv)\n    except SystemExit as e:\n        assert e.code == 0\n"
            "heavy = [m for m in ('torch', 'timm', 'matplotlib') if m in sys.modules]\n"
            "print('HEAVY', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY []" in out.stdout
    assert f"attnreg {napari_attnreg.__version__}" in out.stdout
    assert "--q-th" in out.stdout and "--null-pool" in out.stdout  # built from core.options


def test_option_errors_are_one_line_and_exit_2(capsys, tmp_path):
    for argv, words in ((["--p-th", "2"], "p_th must be a finite number in [0, 1]"),
                        (["--device", "bogus"], "not a compute device"),
                        (["--target-size", "0"], "target_size must be")):
        assert main(["demo", "--out", str(tmp_path), "--n-boot", "4", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("attnreg: error:") and words in err and "Traceback" not in err


def test_summary_and_result_files_state_how_they_were_made(tmp_path):
    import csv
    import hashlib

    import napari_attnreg
    from napari_attnreg.core.models.backbones import DEMO_DIR

    assert main(["demo", "--out", str(tmp_path), "--n-boot", "8", "--q-th", "0.2", "--quiet"]) == 0
    (row,) = csv.DictReader(open(tmp_path / "summary.csv", newline=""))
    sha = hashlib.sha256((DEMO_DIR / "demo_vit.safetensors").read_bytes()).hexdigest()
    assert row["weights_sha256"] == sha and row["q_th"] == "0.2" and row["rule"] == "forwardstop"
    assert row["package_version"] == napari_attnreg.__version__ and row["B"] == "8"
    result = AttentionResult.load(next(tmp_path.glob("*.attnreg.npz")))
    assert result.metadata["weights_sha256"] == sha
    assert result.metadata["package_version"] == napari_attnreg.__version__


def test_the_summary_says_which_layer_head_and_target_each_map_read(tmp_path, blob_image):
    """Two runs into one folder, one with --layer: their rows differed only in a result
    file nobody opens; the summary now names the layer, head, class-map target and sinks."""
    import csv

    image = tmp_path / "cells.tif"
    tifffile.imwrite(image, blob_image)
    common = ["run", str(image), "--n-boot", "8", "--quiet", "--device", "cpu"]
    assert main([*common, "--out", str(tmp_path / "a"), "--layer", "-2", "--head", "1",
                 "--exclude-sinks"]) == 0
    assert main([*common, "--out", str(tmp_path / "b"), "--map", "gradcam"]) == 0
    assert main([*common, "--out", str(tmp_path / "c"), "--map", "heads", "--head", "1"]) == 0
    (heads,) = csv.DictReader(open(tmp_path / "c" / "summary.csv", newline=""))
    assert (heads["layer"], heads["head"]) == ("-1", "all")  # each head is tested
    (layered,) = csv.DictReader(open(tmp_path / "a" / "summary.csv", newline=""))
    (gradcam,) = csv.DictReader(open(tmp_path / "b" / "summary.csv", newline=""))
    assert (layered["map"], layered["layer"], layered["head"], layered["target"],
            layered["exclude_sinks"]) == ("attention", "-2", "1", "", "yes")
    # Grad-CAM reads the last block for the predicted class (its index): no layer, no head
    scored = AttentionResult.load(tmp_path / "b" / "cells.tif.attnreg.npz").metadata["target"]
    assert (gradcam["map"], gradcam["layer"], gradcam["head"], gradcam["target"],
            gradcam["exclude_sinks"]) == ("gradcam", "", "", str(scored), "no")
    assert gradcam["target"].isdigit()


def test_device_and_head_values_are_checked_whole(tmp_path, capsys):
    from napari_attnreg.core.run.options import validate_options

    with pytest.raises(ValueError, match="is not a compute device"):
        validate_options({"device": "cpu\n"})
    with pytest.raises(ValueError, match="head must be 'mean' or a head number"):
        validate_options({"head": "²"})
    assert validate_options({"head": " 2 "})["head"] == 2


def _main_in_a_fresh_process(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` in a new interpreter: its exit code, stderr and the heavy modules it
    imported."""
    import subprocess
    import sys

    code = ("import sys\nfrom napari_attnreg.cli import main\n"
            f"try:\n    rc = main({argv!r})\nexcept SystemExit as e:\n    rc = e.code\n"
            "heavy = [m for m in ('torch', 'timm', 'matplotlib') if m in sys.modules]\n"
            "print(rc, heavy)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    rc, heavy = done.stdout.strip().split(" ", 1)
    return int(rc), done.stderr, heavy


@pytest.mark.parametrize("what", ["missing file", "empty folder"])
def test_nothing_to_run_fails_fast_without_torch_or_an_output_folder(tmp_path, what):
    target = tmp_path / ("missing.tif" if what == "missing file" else "empty")
    if what == "empty folder":
        target.mkdir()
    out = tmp_path / "results"
    rc, err, heavy = _main_in_a_fresh_process(["run", str(target), "--out", str(out)])
    assert rc == 2 and heavy == "[]" and not out.exists()
    assert err.strip().splitlines()[-1].startswith("attnreg: error:") and str(target) in err


def test_a_bad_choice_is_one_error_line_not_the_usage(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["run", "x.tif", "--preset", "bogus"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert err.startswith("attnreg: error: argument --preset: invalid choice: 'bogus'")
    assert "usage:" not in err


def test_the_demo_model_as_default_is_said_on_the_terminal_and_in_help(tmp_path, capsys):
    from napari_attnreg.cli import build_parser

    run_help = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert "not for real data" in " ".join(run_help.split())
    img = tmp_path / "a.tif"
    tifffile.imwrite(img, np.random.default_rng(0).integers(0, 999, (64, 64)).astype(np.uint16))
    args = ["run", str(img), "--n-boot", "4", "--quiet", "--out", str(tmp_path / "o")]
    assert main(args) == 0
    assert "no --model given: using the bundled demo model" in capsys.readouterr().err
    assert main([*args, "--model", "demo"]) == 0
    assert "no --model given" not in capsys.readouterr().err


def test_a_folders_other_files_are_reported_and_paths_printed_once(tmp_path, capsys):
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("x")
    (folder / "table.csv").write_text("a,b")
    (folder / ".DS_Store").write_bytes(b"x")
    (folder / "bad.tif").write_bytes(b"II*\x00 not really a tiff")
    assert main(["run", str(folder), "--model", "demo", "--n-boot", "4", "--quiet",
                 "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "skipped 2 file(s) that are not images: notes.txt, table.csv" in err
    assert "skipped 1 subfolder(s) (sub); add --recursive" in err and ".DS_Store" not in err
    (line,) = [e for e in err.splitlines() if e.startswith("attnreg: error:")]
    assert line.count(str(folder / "bad.tif")) == 1


def test_a_folder_scan_takes_a_tiff_without_an_ending(tmp_path, capsys):
    """A microscope's or a script's TIFF saved without an ending was skipped by a folder
    scan as "not an image" (a DICOM file without one was taken, by its marker)."""
    folder = tmp_path / "in"
    folder.mkdir()
    tifffile.imwrite(folder / "IMG_0001", np.random.default_rng(0).integers(
        0, 999, (64, 64)).astype(np.uint16), ome=True,
        metadata={"axes": "YX", "PhysicalSizeX": 0.5, "PhysicalSizeY": 0.5})
    (folder / "notes").write_text("not an image")
    out = tmp_path / "o"
    assert main(["run", str(folder), "--model", "demo", "--n-boot", "4", "--quiet",
                 "--out", str(out)]) == 0
    assert "skipped 1 file(s) that are not images: notes" in capsys.readouterr().err
    from napari_attnreg import AttentionResult

    result = AttentionResult.load(out / "IMG_0001.attnreg.npz")
    assert result.spatial["scale"] == (0.5, 0.5) and result.spatial["units"] == ("µm", "µm")


def test_ctrl_c_says_how_to_resume_instead_of_a_traceback(tmp_path, monkeypatch, capsys):
    """A Ctrl-C half-way through a batch: one line saying that a rerun resumes (exit 130,
    as shells report SIGINT), not torch's stack frames; the rerun skips the finished image."""
    from napari_attnreg.batch import run as batch

    for i in range(2):
        tifffile.imwrite(tmp_path / f"img{i}.tif",
                         np.random.default_rng(i).integers(0, 999, (48, 48)).astype(np.uint16))
    out = tmp_path / "out"
    argv = ["run", str(tmp_path / "img0.tif"), str(tmp_path / "img1.tif"), "--n-boot", "4",
            "--quiet", "--device", "cpu", "--out", str(out)]
    real = batch.process_item

    def ctrl_c_at_the_second(item, *args, **kwargs):
        if item.source.name == "img1.tif":
            raise KeyboardInterrupt
        return real(item, *args, **kwargs)

    monkeypatch.setattr(batch, "process_item", ctrl_c_at_the_second)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "run the same command again to resume" in err
    assert str(out) in err and "Traceback" not in err
    monkeypatch.setattr(batch, "process_item", real)
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "1 done, 1 skipped, 0 failed" in err
