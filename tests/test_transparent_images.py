"""Pictures with transparency or stored colours that are not RGB: the run analyses what a
viewer shows (transparent pixels as background, a CMYK JPEG in colour), and says so."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from PIL import Image

from napari_attnreg import AttentionResult
from napari_attnreg.cli import main
from napari_attnreg.core.run.images import TransparencyWarning, prepare_image
from napari_attnreg.io.readers import read_source

KW = dict(patch_size=(16, 16), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25),
          default_size=(224, 224), target_size="native")


def _tissue(shape=(64, 80)) -> np.ndarray:
    """A bright brightfield-like RGB picture with a dark stained blob."""
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    blob = np.exp(-((yy - 30) ** 2 + (xx - 50) ** 2) / 80.0)
    rgb = np.stack([235 - 150 * blob, 230 - 170 * blob, 240 - 100 * blob], -1)
    return np.clip(rgb, 0, 255).astype(np.uint8)


def _cut_out(rgb: np.ndarray, seed: int = 0) -> np.ndarray:
    """``rgb`` with its left 24 columns transparent over random colours (what an editor that
    erased them, or a cut-out export, leaves under alpha 0) and one column half transparent."""
    rgba = np.dstack([rgb, np.full(rgb.shape[:2], 255, np.uint8)])
    rgba[:, :24, :3] = np.random.default_rng(seed).integers(0, 256, (rgb.shape[0], 24, 3))
    rgba[:, :24, 3] = 0
    rgba[:, 24, 3] = 128
    return rgba


def test_transparent_pixels_are_background_not_the_colours_under_them():
    rgba = _cut_out(_tissue())
    with pytest.warns(TransparencyWarning, match=r"transparent .*white background"):
        prep = prepare_image(rgba, **KW)
    # the garbage is gone: the cut-out part is plain white, the half-transparent column is
    # half way to white, the rest is the picture itself
    np.testing.assert_array_equal(prep.display[:, :24], 1.0)
    expected = (_tissue()[:, 24].astype(float) * 128 / 255 + 255 * 127 / 255) / 255
    np.testing.assert_allclose(prep.display[:, 24], expected, atol=1 / 255)
    np.testing.assert_allclose(prep.display[:, 25:], _tissue()[:, 25:] / 255, atol=1e-6)
    # another draw of garbage under alpha 0 gives the very same model input
    with pytest.warns(TransparencyWarning):
        again = prepare_image(_cut_out(_tissue(), seed=1), **KW)
    np.testing.assert_array_equal(prep.tensor.numpy(), again.tensor.numpy())


def test_a_dark_image_gets_a_black_background_and_opaque_rgba_says_nothing():
    dark = 255 - _tissue()  # fluorescence-like: mostly dark
    with pytest.warns(TransparencyWarning, match="black background"):
        prep = prepare_image(_cut_out(dark), **KW)
    np.testing.assert_array_equal(prep.display[:, :24], 0.0)
    opaque = np.dstack([dark, np.full(dark.shape[:2], 255, np.uint8)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", TransparencyWarning)
        prepare_image(opaque, **KW)


def test_a_densely_stained_brightfield_cut_out_lies_on_white_not_black():
    # a crop of scikit-image's IHC slide is dark on average (mean 96 of 255 where visible)
    # but is tissue on glass: the mean-brightness rule gave it a black surround, edges the
    # slide never had
    from skimage import data

    tissue = data.immunohistochemistry()[:96, 150:246]
    assert tissue[:, 24:].mean() < 127.5  # what the old rule read as a dark picture
    with pytest.warns(TransparencyWarning, match="white background"):
        prep = prepare_image(_cut_out(tissue), **KW)
    np.testing.assert_array_equal(prep.display[:, :24], 1.0)


def test_sixteen_bit_rgba_is_scaled_from_its_visible_pixels():
    rgb = _tissue().astype(np.uint16) * 16  # 12-bit values in 16 bits
    rgba = np.dstack([rgb, np.full(rgb.shape[:2], 65535, np.uint16)])
    rgba[:, :24, :3] = 65535  # bright garbage under alpha 0 would squash the scaling
    rgba[:, :24, 3] = 0
    with pytest.warns(TransparencyWarning):
        prep = prepare_image(rgba, **KW)
    assert prep.display[:, 30:].min() < 0.2  # the blob keeps its contrast


def test_the_command_line_analyses_a_cut_out_png_as_the_flattened_picture(tmp_path, capsys):
    import imageio.v3 as iio

    rgba = _cut_out(_tissue((96, 96)))
    iio.imwrite(tmp_path / "cut.png", rgba)
    flat = rgba[..., :3].copy()
    flat[:, :24] = 255
    flat[:, 24] = np.rint(rgba[:, 24, :3].astype(float) * 128 / 255 + 255 * 127 / 255).astype(np.uint8)
    iio.imwrite(tmp_path / "flat.png", flat)
    run = ["run", str(tmp_path / "cut.png"), str(tmp_path / "flat.png"), "--model", "demo",
           "--n-boot", "4", "--quiet", "--out", str(tmp_path / "out")]
    assert main(run) == 0
    assert "attnreg: warning: The image's alpha channel" in capsys.readouterr().err
    cut = AttentionResult.load(tmp_path / "out" / "cut.png.attnreg.npz")
    same = AttentionResult.load(tmp_path / "out" / "flat.png.attnreg.npz")
    np.testing.assert_allclose(cut.attention, same.attention, rtol=1e-5, atol=1e-7)
    assert any("alpha channel" in d.message for d in cut.diagnostics)
    assert not any("alpha channel" in d.message for d in same.diagnostics)


def test_a_grey_png_with_alpha_is_grey_over_background_not_two_channels(tmp_path):
    grey = _tissue()[..., 1]
    la = np.dstack([grey, np.full(grey.shape, 255, np.uint8)])
    la[:, :24, 0], la[:, :24, 1] = 7, 0
    Image.fromarray(la, "LA").save(tmp_path / "la.png")
    with pytest.warns(TransparencyWarning, match="la.png: .*white background"):
        stack, _ = read_source(tmp_path / "la.png")
    data = np.asarray(stack.data)
    assert data.shape == grey.shape and stack.channel_axis is None  # grey, not grey + alpha
    np.testing.assert_array_equal(data[:, :24], 255)
    np.testing.assert_array_equal(data[:, 24:], grey[:, 24:])


def test_a_palette_png_keeps_its_transparent_entry_as_alpha(tmp_path):
    picture = Image.fromarray(_tissue()).convert("P", palette=Image.ADAPTIVE, colors=16)
    index = np.asarray(picture).copy()
    index[:, :24] = 15
    picture = Image.fromarray(index, "P")
    picture.putpalette(Image.fromarray(_tissue()).convert(
        "P", palette=Image.ADAPTIVE, colors=16).getpalette())
    picture.save(tmp_path / "p.png", transparency=15)
    stack, _ = read_source(tmp_path / "p.png")
    data = np.asarray(stack.data)
    assert data.shape[-1] == 4 and stack.rgb
    np.testing.assert_array_equal(data[:, :24, 3], 0)


def test_a_cmyk_jpeg_is_analysed_in_its_colours_not_as_inks(tmp_path):
    Image.fromarray(_tissue()).convert("CMYK").save(tmp_path / "scan.jpg", quality=95)
    stack, _ = read_source(tmp_path / "scan.jpg")
    data = np.asarray(stack.data)
    assert data.shape == (*_tissue().shape[:2], 3)  # RGB, not C, M, Y taken for R, G, B
    assert np.abs(data.astype(int) - _tissue()).mean() < 6


def test_a_jpeg_turned_by_its_exif_tag_is_analysed_as_stored_and_said_so(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(_tissue()).save(tmp_path / "phone.jpg", exif=exif.tobytes())
    with pytest.warns(UserWarning, match="phone.jpg: its EXIF orientation .* 90° clockwise"):
        stack, _ = read_source(tmp_path / "phone.jpg")
    assert stack.plane_shape == _tissue().shape[:2]  # as napari, Fiji and QuPath show it


def test_an_empty_file_is_called_empty(tmp_path):
    (tmp_path / "scan.png").write_bytes(b"")
    with pytest.raises(ValueError, match=r"scan.png is empty \(0 bytes\)"):
        read_source(tmp_path / "scan.png")


def test_a_tiled_run_of_a_cut_out_png_lists_the_note_among_its_diagnostics(tmp_path):
    """The batch prepares a tiled image before the run (for its figure): the note was
    printed there and lost from the result."""
    import imageio.v3 as iio

    iio.imwrite(tmp_path / "cut.png", _cut_out(_tissue((200, 200))))
    assert main(["run", str(tmp_path / "cut.png"), "--tiled", "--model", "demo", "--n-boot",
                 "4", "--quiet", "--out", str(tmp_path / "out")]) == 0
    result = AttentionResult.load(tmp_path / "out" / "cut.png.attnreg.npz")
    assert sum("alpha channel" in d.message for d in result.diagnostics) == 1


def _rgba_tiff(path, size=200):
    import tifffile

    tifffile.imwrite(path, _cut_out(_tissue((size, size))), photometric="rgb",
                     extrasamples=["unassalpha"])


def test_a_tiled_run_of_an_rgba_tiff_flattens_it_in_memory_when_it_fits(tmp_path):
    """A TIFF is read tile by tile for a tiled run, which left its alpha out silently."""
    _rgba_tiff(tmp_path / "cut.tif")
    assert main(["run", str(tmp_path / "cut.tif"), "--tiled", "--model", "demo", "--n-boot",
                 "4", "--quiet", "--out", str(tmp_path / "out")]) == 0
    result = AttentionResult.load(tmp_path / "out" / "cut.tif.attnreg.npz")
    assert any("white background" in d.message for d in result.diagnostics)


def test_an_rgba_tiff_too_large_for_memory_says_its_alpha_is_not_applied(tmp_path,
                                                                          monkeypatch):
    from napari_attnreg.core.run import lazy

    monkeypatch.setattr(lazy, "MAX_UNTILED_PIXELS", 100)  # as if it were a 50000² slide
    _rgba_tiff(tmp_path / "cut.tif")
    assert main(["run", str(tmp_path / "cut.tif"), "--tiled", "--model", "demo", "--n-boot",
                 "4", "--quiet", "--out", str(tmp_path / "out")]) == 0
    result = AttentionResult.load(tmp_path / "out" / "cut.tif.attnreg.npz")
    (note,) = [d.message for d in result.diagnostics if "alpha channel" in d.message]
    assert "12.5% of its pixels transparent" in note and "not applied" in note


def test_a_fourth_channel_that_marks_nothing_opaque_is_not_taken_for_alpha():
    """A 4-channel 16-bit microscopy array laid out (H, W, 4) is read as RGBA by shape: its
    fourth channel made nearly every pixel transparent, i.e. a black image."""
    rng = np.random.default_rng(0)
    four = (rng.random((64, 80, 4)) * 4000).astype(np.uint16)
    with pytest.warns(TransparencyWarning, match="not taken for transparency.*channel_axis=-1"):
        prep = prepare_image(four, **KW)
    plain = prepare_image(four[..., :3], **KW)
    np.testing.assert_array_equal(prep.tensor.numpy(), plain.tensor.numpy())


def test_what_reading_a_picture_says_reaches_the_results_diagnostics(tmp_path):
    """A grey+alpha PNG is flattened and an EXIF orientation named by the reader; both were
    printed and then missing from the result and the batch's summary."""
    import csv

    grey = _tissue((96, 96))[..., 1]
    la = np.dstack([grey, np.full(grey.shape, 255, np.uint8)])
    la[:, :24, 1] = 0
    Image.fromarray(la, "LA").save(tmp_path / "la.png")
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(_tissue((96, 96))).save(tmp_path / "phone.jpg", exif=exif.tobytes())
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "la.png"), str(tmp_path / "phone.jpg"), "--model",
                 "demo", "--n-boot", "4", "--quiet", "--out", str(out)]) == 0
    flat = AttentionResult.load(out / "la.png.attnreg.npz")
    assert sum("alpha channel" in d.message for d in flat.diagnostics) == 1
    turned = AttentionResult.load(out / "phone.jpg.attnreg.npz")
    assert any("EXIF orientation" in d.message for d in turned.diagnostics)
    rows = list(csv.DictReader(open(out / "summary.csv", encoding="utf-8")))
    assert all("statistics_warning" in r["warnings"] for r in rows)


def test_a_text_file_under_an_image_name_is_called_text(tmp_path):
    (tmp_path / "scan.jpg").write_text("<html><body>404 Not Found</body></html>\n")
    with pytest.raises(ValueError, match=r"scan.jpg is not a readable image: it holds text "
                                         r"\(it starts '<html><body>404"):
        read_source(tmp_path / "scan.jpg")
    (tmp_path / "grey.pgm").write_text("P2\n2 2\n255\n0 255\n255 0\n")  # a text image format
    stack, _ = read_source(tmp_path / "grey.pgm")
    assert stack.plane_shape == (2, 2)
