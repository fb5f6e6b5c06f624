"""The command line with bad files and bad options: one ``attnreg: error:`` line that says what
to do and exit code 2 (the run cannot start) or 1 (that file failed, the batch went on) —
never a traceback. Small files, the bundled demo model, 8 bootstrap images."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

from napari_attnreg.cli import main

FAST = ["--model", "demo", "--n-boot", "8", "--device", "cpu", "--quiet", "--target-size",
        "native"]


def _image(shape=(64, 64), dtype=np.uint16, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = 300 + 40 * rng.standard_normal(shape)
    img[20:30, 20:30] += 2000
    return img.astype(dtype)


def run(capsys, *args) -> tuple[int, str]:
    """Exit code and stderr of ``attnreg run ...``; argparse's own exits count too."""
    try:
        code = main(["run", *map(str, args)])
    except SystemExit as stop:  # argparse: usage line + "error:", code 2
        code = stop.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "good.tif"
    tifffile.imwrite(path, _image())
    return path


# ---- the run cannot start: exit 2 before any image is processed ------------------------------
def test_out_is_an_existing_file(tmp_path, good, capsys):
    taken = tmp_path / "taken.txt"
    taken.write_text("keep me")
    code, err = run(capsys, good, "--out", taken, *FAST)
    assert code == 2 and "attnreg: error:" in err and "is an existing file" in err
    assert taken.read_text() == "keep me"


def test_out_below_a_file_cannot_be_created(tmp_path, good, capsys):
    taken = tmp_path / "taken.txt"
    taken.write_text("x")
    code, err = run(capsys, good, "--out", taken / "results", *FAST)
    assert code == 2 and "attnreg: error: Cannot write results into" in err


@pytest.mark.parametrize("size", ["0", "4", "7"])
def test_target_size_below_one_patch(tmp_path, good, capsys, size):
    args = [a for a in FAST if a not in ("--target-size", "native")]
    code, err = run(capsys, good, "--out", tmp_path / "o", *args, "--target-size", size)
    assert code == 2 and "attnreg: error:" in err and "'model'" in err and "'native'" in err
    if size != "0":  # 0 is refused by the option validator already; 4 and 7 by the patch size
        assert "long side in pixels ≥ the patch size (8)" in err
    assert not list((tmp_path / "o").rglob("*.npz"))


@pytest.mark.parametrize("size", ["-16", "big", "0x0"])
def test_target_size_of_the_wrong_kind(tmp_path, good, capsys, size):
    args = [a for a in FAST if a not in ("--target-size", "native")]
    code, err = run(capsys, good, "--out", tmp_path / "o", *args, "--target-size", size)
    assert code == 2 and "error:" in err and "target" in err


@pytest.mark.parametrize("flag,value,words", [
    ("--p-th", "2", "p_th"),
    ("--p-th", "nan", "p_th"),
    ("--l-th", "5", "l_th"),
    ("--device", "bogus", "device"),
    ("--seed", "1.5", "seed"),
    ("--n-boot", "0", "n_boot"),
    ("--chunk-size", "-3", "chunk"),
])
def test_bad_option_values(tmp_path, good, capsys, flag, value, words):
    args = list(FAST)
    if flag in args:
        i = args.index(flag)
        del args[i:i + 2]
    code, err = run(capsys, good, "--out", tmp_path / "o", *args, flag, value)
    assert code == 2 and "error:" in err and words.replace("_", "-") in err.replace("_", "-")


# ---- one file fails, the batch goes on: exit 1, that file named -----------------------------
def _one_bad(tmp_path, capsys, name, writer, *extra):
    bad = tmp_path / "in" / name
    bad.parent.mkdir(exist_ok=True)
    writer(bad)
    tifffile.imwrite(tmp_path / "in" / "good.tif", _image())
    code, err = run(capsys, tmp_path / "in", "--out", tmp_path / "o", *FAST, *extra)
    assert code == 1 and "attnreg: error:" in err and name in err
    assert (tmp_path / "o" / "good.tif.attnreg.npz").is_file()  # the batch went on
    return err


def test_a_text_file_named_png(tmp_path, capsys):
    err = _one_bad(tmp_path, capsys, "notes.png", lambda p: p.write_text("not an image"))
    assert "is not a readable image" in err


def test_a_damaged_tiff(tmp_path, capsys):
    err = _one_bad(tmp_path, capsys, "cut.tif",
                   lambda p: p.write_bytes(b"II*\x00" + b"\x00" * 10))
    assert "is not a readable image" in err


def test_an_ambiguous_three_plane_tiff_says_how_to_choose(tmp_path, capsys):
    err = _one_bad(tmp_path, capsys, "three.tif",
                   lambda p: tifffile.imwrite(p, np.stack([_image(seed=s) for s in range(3)])))
    assert "ambiguous" in err and "--channel-axis 0" in err and "split" in err


def test_nan_pixels(tmp_path, capsys):
    def write(path):
        img = _image().astype(np.float32)
        img[:2, :5] = np.nan
        tifffile.imwrite(path, img)

    err = _one_bad(tmp_path, capsys, "holes.tif", write)
    assert "NaN/inf values at 10 pixels" in err and "constant" not in err


def test_a_constant_image(tmp_path, capsys):
    err = _one_bad(tmp_path, capsys, "flat.tif",
                   lambda p: tifffile.imwrite(p, np.full((64, 64), 9, np.uint16)))
    assert "constant" in err


def test_an_image_smaller_than_a_patch(tmp_path, capsys):
    err = _one_bad(tmp_path, capsys, "tiny.tif", lambda p: tifffile.imwrite(p, _image((5, 64))))
    assert "smaller than one" in err


def test_a_channel_axis_that_does_not_exist(tmp_path, capsys):
    tifffile.imwrite(tmp_path / "x.tif", _image())
    code, err = run(capsys, tmp_path / "x.tif", "--out", tmp_path / "o", *FAST,
                    "--channel-axis", "5")
    assert code in (1, 2) and "attnreg: error:" in err and "channel_axis=5 does not exist" in err


# ---- layouts that used to be split wrongly now run as the file means them ------------------
def test_layouts_from_the_file(tmp_path, capsys):
    import imageio.v3 as iio

    folder = tmp_path / "in"
    folder.mkdir()
    two = np.stack([_image(seed=1), _image(seed=2)], axis=-1)
    tifffile.imwrite(folder / "two_channels.tif", two)  # (64, 64, 2): not 64 planes
    frames = np.stack([np.repeat((_image(seed=s) // 16).astype(np.uint8)[..., None], 3, -1)
                       for s in range(3)])
    iio.imwrite(folder / "movie.gif", frames)  # 3 frames: 3 planes
    tifffile.imwrite(folder / "three.tif", np.stack([_image(seed=s) for s in range(3)]))
    tifffile.imwrite(folder / "huge.tif", _image().astype(np.float64) * 1e300)
    code, err = run(capsys, folder / "two_channels.tif", folder / "movie.gif",
                    folder / "huge.tif", "--out", tmp_path / "o", *FAST)
    assert code == 0, err
    outputs = sorted(str(p.relative_to(tmp_path / "o")) for p in (tmp_path / "o").rglob("*.npz"))
    assert outputs == ["huge.tif.attnreg.npz", "movie.gif/plane_0000.attnreg.npz",
                       "movie.gif/plane_0001.attnreg.npz", "movie.gif/plane_0002.attnreg.npz",
                       "two_channels.tif.attnreg.npz"]
    code, err = run(capsys, folder / "three.tif", "--out", tmp_path / "o3", *FAST,
                    "--channel-axis", "0")
    assert code == 0 and (tmp_path / "o3" / "three.tif.attnreg.npz").is_file()
