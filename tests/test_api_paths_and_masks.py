"""regularize() on a file path and on an image read on demand; .npy masks; grey tissue masks.

Small images, the demo model and a few bootstrap draws: each run is a second or two on a CPU.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")

from napari_attnreg import regularize  # noqa: E402
from napari_attnreg.core.run import api  # noqa: E402
from napari_attnreg.core.run.lazy import check_untiled_size  # noqa: E402
from napari_attnreg.core.run.tiling import make_layout  # noqa: E402
from napari_attnreg.core.run.tissue import (  # noqa: E402
    AUTO_BRIGHT_BACKGROUND,
    AUTO_DARK_BACKGROUND,
    auto_tissue,
    auto_tissue_mask,
    read_mask,
    tissue_for,
)
from napari_attnreg.io.slides import open_slide  # noqa: E402

FAST = {"n_boot": 4, "seed": 0, "device": "cpu"}
SIZE = 512
TISSUE = 0.55  # the tissue block's share of each side, top left


def _rgb(size: int = SIZE) -> np.ndarray:
    rng = np.random.default_rng(0)
    img = np.full((size, size, 3), 236, np.uint8)  # white glass
    t = int(size * TISSUE)
    stain = rng.random((t, t, 3)) * 90 + np.array([130, 40, 120])
    img[:t, :t] = stain.clip(0, 255).astype(np.uint8)
    return img


def _aperio(w: int, h: int) -> str:
    return (f"Aperio Image Library v10.0.50\n{w}x{h} [0,0 {w}x{h}] (256x256) RAW/RGB"
            "|AppMag = 40|MPP = 0.25")


@pytest.fixture(scope="module")
def svs(tmp_path_factory) -> Path:
    """An Aperio-style SVS of 512² at 0.25 µm, a thumbnail, levels 1/2 and 1/4."""
    path = tmp_path_factory.mktemp("api") / "small.svs"
    img = _rgb()
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), description=_aperio(SIZE, SIZE), photometric="rgb",
                  metadata=None)
        tif.write(img[::8, ::8].copy(), description="Aperio Image Library v10.0.50\nthumb",
                  photometric="rgb", metadata=None)  # an SVS's second page: its thumbnail
        for k in (2, 4):
            tif.write(img[::k, ::k].copy(), tile=(128, 128),
                      description=_aperio(SIZE // k, SIZE // k), photometric="rgb",
                      metadata=None)
    return path


# -- grey thumbnails: brightfield and dark field ---------------------------------------------

def _brightfield(dtype=np.uint8, size: int = 256) -> np.ndarray:
    """Grey brightfield: glass 236, tissue about 140 (darker)."""
    rng = np.random.default_rng(2)
    img = 236 + rng.normal(0, 2.0, (size, size))
    t = int(size * TISSUE)
    img[:t, :t] = 140 + rng.normal(0, 12.0, (t, t))
    return _as(img, dtype)


def _darkfield(dtype=np.uint8, size: int = 256) -> np.ndarray:
    """Grey dark field / fluorescence: a black field about 10 with noise, tissue 120–200."""
    rng = np.random.default_rng(3)
    img = 10 + rng.normal(0, 3.0, (size, size))
    t = int(size * TISSUE)
    img[:t, :t] = rng.uniform(120, 200, (t, t))
    return _as(img, dtype)


def _as(img: np.ndarray, dtype) -> np.ndarray:
    if dtype == np.uint16:  # 12 bits used of 16
        return (img.clip(0, 255) * 16).astype(np.uint16)
    return img.clip(0, 255).astype(np.uint8)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16], ids=["8bit", "12of16bit"])
@pytest.mark.parametrize("make, source", [(_brightfield, AUTO_BRIGHT_BACKGROUND),
                                          (_darkfield, AUTO_DARK_BACKGROUND)],
                         ids=["brightfield", "darkfield"])
def test_a_grey_thumbnails_background_is_the_class_nearer_its_extreme(make, source, dtype):
    thumb = make(dtype)
    mask, said = auto_tissue(thumb)
    t = int(thumb.shape[0] * TISSUE)
    assert mask[:t - 4, :t - 4].mean() > 0.99  # the tissue
    assert mask[t + 4:, :].mean() < 0.01 and mask[:, t + 4:].mean() < 0.01  # the background
    assert said == source
    np.testing.assert_array_equal(auto_tissue_mask(thumb), mask)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16], ids=["8bit", "12of16bit"])
def test_an_empty_black_field_holds_no_tissue(dtype):
    rng = np.random.default_rng(4)
    black = _as(10 + rng.normal(0, 3.0, (256, 256)), dtype)
    assert not auto_tissue_mask(black).any()


def test_the_record_says_what_the_grey_mask_thresholded():
    layout = make_layout((512, 512), tile=(128, 128), patch=(16, 16), overlap=0)
    dark = tissue_for("auto", _darkfield(), layout)
    bright = tissue_for("auto", _brightfield(), layout)
    colour = tissue_for("auto", _rgb(256), layout)
    assert dark.source == "auto (Otsu on brightness, dark background)"
    assert bright.source == "auto (Otsu on darkness, bright background)"
    assert colour.source == ("auto (Otsu on chroma, bright background; pen ink and black "
                             "left out)")
    # the tissue block (top left) is kept in both polarities, the far corner is not
    for made in (dark, bright, colour):
        tiles = made.tiles.reshape(4, 4)
        assert tiles[0, 0] and not tiles[3, 3]


@pytest.fixture(scope="module")
def darkfield_tif(tmp_path_factory) -> Path:
    """A grey dark-field pyramidal TIFF (12 bits in 16, sub-IFDs) at 0.5 µm per pixel."""
    path = tmp_path_factory.mktemp("api") / "darkfield.tif"
    img = _darkfield(np.uint16, SIZE)
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(128, 128), subifds=1, photometric="minisblack", metadata=None,
                  resolution=(20000, 20000), resolutionunit="CENTIMETER")
        tif.write(img[::2, ::2].copy(), tile=(128, 128), subfiletype=1,
                  photometric="minisblack", metadata=None, resolution=(10000, 10000),
                  resolutionunit="CENTIMETER")
    return path


def test_a_tiled_run_of_a_grey_darkfield_slide_runs_only_its_tissue(darkfield_tif):
    from napari_attnreg.core.results.display import tissue_tokens

    image = open_slide(darkfield_tif)
    result = regularize(image, "demo", tiled=True, **FAST)
    md = result.metadata
    assert md["tissue_mask"] == "auto (Otsu on brightness, dark background)"
    assert 0 < md["n_tissue_tiles"] < md["n_tiles_total"]
    tested = tissue_tokens(result)
    gh, _ = result.grid_shape
    t = int(gh * TISSUE)
    # the bright tissue (top left) is run, the black field beyond it is not
    assert tested[:t - 1, :t - 1].all() and not tested[-2:, :].any()
    assert not tested[:, -2:].any()


# -- regularize(path) ------------------------------------------------------------------------

@pytest.mark.parametrize("as_path", [str, Path], ids=["str", "Path"])
def test_regularize_opens_a_slide_path_as_the_command_line_does(svs, as_path):
    result = regularize(as_path(svs), "demo", tiled=True, level=1, **FAST)
    md = result.metadata
    assert md["slide_level"] == 1 and md["image_kind"] == "pathology" and md["level"] == 1
    assert result.spatial["scale"] == (0.5, 0.5) and result.spatial["units"] == ("µm", "µm")
    assert md["source"] == str(svs)
    assert md["tissue_mask"].startswith("auto") and md["n_tissue_tiles"] < md["n_tiles_total"]


def test_an_untiled_run_of_a_slide_path_reads_its_level_whole(svs):
    result = regularize(svs, "demo", level=2, **FAST)
    assert result.image_shape[:2] == (128, 128)
    assert result.spatial["scale"] == (1.0, 1.0)
    assert result.metadata["image_kind"] == "pathology"
    # read whole, the level is still recorded (the GeoJSON's full-resolution frame needs it)
    md = result.metadata
    assert (md["level"], md["slide_level"], md["slide_downsample"]) == (2, 2, 4.0)


def test_an_untiled_command_line_run_of_a_slide_records_its_level(svs, tmp_path):
    from napari_attnreg import AttentionResult
    from napari_attnreg.cli import main

    out = tmp_path / "out"
    assert main(["run", str(svs), "--level", "2", "--out", str(out), "--model", "demo",
                 "--n-boot", "4", "--device", "cpu", "--quiet"]) == 0
    md = AttentionResult.load(next(out.glob("*.attnreg.npz"))).metadata
    assert (md["slide_level"], md["slide_downsample"]) == (2, 4.0)


def test_regularize_takes_the_path_of_an_ordinary_image(tmp_path):
    path = tmp_path / "cells.tif"
    tifffile.imwrite(path, _brightfield(size=96))
    result = regularize(path, "demo", **FAST)
    assert result.image_shape[:2] == (96, 96) and result.metadata["source"] == str(path)


def test_a_stack_file_goes_to_regularize_stack_as_the_error_says(tmp_path):
    # regularize() said "read it and use regularize_stack()"; regularize_stack(path) failed
    # with "Image dtype <U18 is not numeric" and the reader's PlaneStack with "dtype object"
    from napari_attnreg import regularize_stack
    from napari_attnreg.io.readers import read_stack

    rng = np.random.default_rng(0)
    stack = (rng.random((2, 3, 64, 48)) * 4000).astype(np.uint16)
    path = tmp_path / "embryo.tif"
    tifffile.imwrite(path, stack, imagej=True, metadata={"axes": "TZYX", "unit": "um"},
                     resolution=(1 / 0.5, 1 / 0.5))
    with pytest.raises(ValueError, match=r"napari_attnreg\.regularize_stack\(path"):
        regularize(path, "demo", **FAST)
    results = regularize_stack(path, "demo", **FAST)
    assert len(results) == 6 and results.complete
    assert results[5].metadata["source"] == str(path)
    assert results[5].spatial["scale"] == pytest.approx((0.5, 0.5))  # the file's pixel size
    np.testing.assert_array_equal(results[5].attention,
                                  regularize(stack[1, 2], "demo", **FAST).attention)
    from_reader = regularize_stack(read_stack(path), "demo", **FAST)
    np.testing.assert_array_equal(from_reader[5].attention, results[5].attention)
    with pytest.raises(ValueError, match="takes pixels, not a file"):
        api.regularize_stack(str(path), "demo", **FAST)


@pytest.mark.parametrize("option", [{"level": 1}, {"mpp": 2.0}], ids=["level", "mpp"])
def test_a_slide_level_for_an_image_of_one_resolution_is_refused_not_recorded(
        tmp_path, capsys, option):
    from napari_attnreg.cli import main

    path = tmp_path / "cells.tif"
    tifffile.imwrite(path, _brightfield(size=96))
    for tiled in (True, False):  # read whole, it was recorded as read at the level asked
        with pytest.raises(ValueError, match="neither a slide nor a pyramid.*Leave them"):
            regularize(path, "demo", tiled=tiled, **option, **FAST)
    with pytest.raises(ValueError, match="pixels are given already"):
        regularize(_brightfield(size=96), "demo", **option, **FAST)
    flag = [f"--{next(iter(option))}", str(next(iter(option.values())))]
    out = tmp_path / "out"
    assert main(["run", str(path), "--tiled", *flag, "--out", str(out), "--model", "demo",
                 "--n-boot", "4", "--device", "cpu", "--quiet"]) == 1
    assert "neither a slide nor a pyramid" in capsys.readouterr().err
    assert not list(out.glob("*.attnreg.npz"))
    # and --help says so, where it used to say that other images ignore it
    from napari_attnreg.core.run.options import option as described

    assert "ignore" not in described("level").help and "refused" in described("level").help


@pytest.mark.parametrize("name", ["photo.png", "cells.tif"])
def test_a_damaged_file_with_a_level_is_called_damaged(tmp_path, name):
    # not "an image of one resolution": the bytes are not an image at all
    path = tmp_path / name
    path.write_bytes(b"not an image, whatever its name says")
    with pytest.raises(ValueError, match="is not a readable image"):
        regularize(path, "demo", level=1, **FAST)


def test_a_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no such image file"):
        regularize(tmp_path / "nothing.svs", "demo", tiled=True, **FAST)
    with pytest.raises(ValueError, match="no such image file"):
        regularize(str(tmp_path / "nothing.tif"), "demo", **FAST)


def test_a_path_holding_a_stack_points_to_regularize_stack(tmp_path):
    path = tmp_path / "stack.tif"
    tifffile.imwrite(path, np.random.default_rng(0).integers(0, 255, (5, 64, 64), np.uint8),
                     photometric="minisblack", metadata={"axes": "ZYX"})
    with pytest.raises(ValueError, match="holds 5 planes.*regularize_stack"):
        regularize(path, "demo", **FAST)


# -- regularize(LazyImage) untiled -----------------------------------------------------------

def test_an_untiled_run_of_an_opened_slide_reads_it_whole_and_keeps_its_provenance(svs):
    image = open_slide(svs, level=2)
    result = regularize(image, "demo", **FAST)
    md = result.metadata
    assert result.image_shape[:2] == (128, 128)
    assert md["slide_level"] == 2 and md["slide_resample"] == 1 and md["slide_downsample"] == 4
    assert result.spatial["scale"] == (1.0, 1.0) and md["image_kind"] == "pathology"


def test_an_untiled_run_of_a_resampled_slide_is_at_the_resolution_asked(svs):
    image = open_slide(svs, mpp=1.5)  # level 2 (1 µm) resampled by 1.5
    result = regularize(image, "demo", **FAST)
    assert result.image_shape[:2] == image.analysed_shape == (85, 85)
    assert result.spatial["scale"] == pytest.approx((1.5, 1.5))


def test_an_untiled_run_of_an_opened_slide_is_refused_above_the_budget_before_reading(
        svs, monkeypatch):
    image = open_slide(svs, level=0)
    monkeypatch.setattr(api, "check_untiled_size",
                        functools.partial(check_untiled_size, limit=100 * 100))

    def no_read(*_args):
        raise AssertionError("read before the size check")

    monkeypatch.setattr(type(image), "read", no_read)
    with pytest.raises(ValueError, match="run it tiled"):
        regularize(image, "demo", **FAST)


# -- level / mpp with an image already opened ------------------------------------------------

@pytest.mark.parametrize("options", [{"level": 2}, {"mpp": 2.0}], ids=["level", "mpp"])
@pytest.mark.parametrize("tiled", [True, False], ids=["tiled", "untiled"])
def test_level_or_mpp_for_an_opened_slide_is_refused_not_recorded(svs, options, tiled):
    image = open_slide(svs, level=1)
    with pytest.raises(ValueError, match=re.escape("was opened at level 1")) as err:
        regularize(image, "demo", tiled=tiled, **options, **FAST)
    assert "open_slide" in str(err.value) and "path" in str(err.value)


def test_the_level_an_image_was_opened_at_may_be_repeated(svs):
    image = open_slide(svs, level=2)
    result = regularize(image, "demo", tiled=True, level=2, tissue_mask="none", **FAST)
    assert result.metadata["slide_level"] == 2


# -- .npy masks ------------------------------------------------------------------------------

def test_a_npy_mask_is_read_with_numpy(tmp_path):
    mask = np.zeros((32, 48), np.uint8)
    mask[:8, :8] = 3
    np.save(tmp_path / "m.npy", mask)
    read, source = read_mask(str(tmp_path / "m.npy"))
    assert source == "file m.npy" and read.dtype == bool
    np.testing.assert_array_equal(read, mask > 0)
    layout = make_layout((320, 480), tile=(80, 80), patch=(16, 16), overlap=0)
    assert tissue_for(tmp_path / "m.npy", None, layout).n_tissue == 1


def test_a_pickled_npy_mask_is_not_unpickled(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="not a readable mask image"):
        read_mask(tmp_path / "obj.npy")


@pytest.mark.parametrize("shape", [(1, 1), (1, 1024), (1024, 1)])
def test_a_degenerate_mask_reports_the_shape_it_had(tmp_path, shape):
    np.save(tmp_path / "thin.npy", np.ones(shape, np.uint8))
    with pytest.raises(ValueError, match=re.escape(f"got shape {shape}")):
        read_mask(tmp_path / "thin.npy")
    with pytest.raises(ValueError, match=re.escape(f"got shape {shape}")):
        read_mask(np.ones(shape, bool))


def test_a_probability_map_is_tissue_at_one_half_and_says_so(tmp_path):
    prob = np.full((64, 64), 0.02, np.float32)  # a classifier's glass, never exactly 0
    prob[:20, :30] = 0.9
    mask, source = read_mask(prob)
    assert mask[:20, :30].all() and mask.sum() == 20 * 30
    assert source == "array (probability ≥ 0.5)"
    labels = np.zeros((64, 64), np.float32)  # 0/1 floats stay labels
    labels[5, 5] = 1.0
    assert read_mask(labels)[0].sum() == 1 and read_mask(labels)[1] == "array"


def test_a_mask_painted_in_the_alpha_channel_is_read_from_it(tmp_path):
    rgba = np.zeros((32, 48, 4), np.uint8)
    rgba[4:10, 6:20, 3] = 255
    path = tmp_path / "alpha.png"
    import imageio.v3 as iio

    iio.imwrite(path, rgba)
    mask, _ = read_mask(str(path))
    assert mask.sum() == 6 * 14 and mask[4:10, 6:20].all()


def test_an_indexed_mask_is_read_by_its_labels_not_its_colours(tmp_path):
    # QuPath's labelled-image export: an indexed PNG whose background label 0 is white;
    # expanded to colours, the white was > 0 and the whole slide was tissue
    from PIL import Image

    labels = np.zeros((32, 48), np.uint8)
    labels[4:10, 6:20] = 1
    image = Image.fromarray(labels, mode="L").convert("P")
    image.putpalette([255, 255, 255, 200, 0, 0] + [0] * (3 * 254))  # white glass, red tissue
    image.save(tmp_path / "labels.png")
    mask, source = read_mask(str(tmp_path / "labels.png"))
    assert source == "file labels.png"
    np.testing.assert_array_equal(mask, labels > 0)


def test_a_mask_file_that_is_tissue_everywhere_is_warned_of(tmp_path):
    # a background painted white (an RGB mask, an inverted one): every tile ran, silently
    from PIL import Image

    rgb = np.full((32, 48, 3), 255, np.uint8)
    rgb[4:10, 6:20] = (200, 0, 0)
    Image.fromarray(rgb).save(tmp_path / "white.png")
    with pytest.warns(UserWarning, match=r"every pixel of white.png is > 0.*must be 0"):
        mask, _ = read_mask(str(tmp_path / "white.png"))
    assert mask.all()


def test_a_result_file_or_numpy_archive_is_not_analysed_as_an_image(tmp_path, rng):
    # imageio read an .npz's first array as a picture: a saved result was "analysed" as a
    # 16×16 image of its own attention map, on the command line and in the notebook
    from napari_attnreg.io.readers import read_stack

    saved = regularize(rng.random((64, 64)), "demo", **FAST).save(tmp_path / "a.attnreg.npz")
    with pytest.raises(ValueError, match=r"a.attnreg.npz is a napari-attnreg result file, "
                                         r"not an image.*AttentionResult.load"):
        regularize(saved, "demo", **FAST)
    with pytest.raises(ValueError, match="result file, not an image"):
        read_stack(saved)
    np.savez(tmp_path / "arrays.npz", image=rng.random((64, 64)))
    with pytest.raises(ValueError, match=r"NumPy archive \(.npz\), not an image.*numpy.load"):
        regularize(tmp_path / "arrays.npz", "demo", **FAST)


def test_a_volume_saved_as_npy_is_read_as_planes_and_objects_are_refused(tmp_path, rng):
    # a NIfTI exported with np.save was "not a readable image" (imageio has no .npy reader)
    from napari_attnreg import regularize_stack
    from napari_attnreg.batch.items import collect_inputs
    from napari_attnreg.io.readers import read_stack

    volume = (rng.normal(0, 300, (5, 40, 48))).astype(np.int16)
    np.save(tmp_path / "ct.npy", volume)
    stack = read_stack(tmp_path / "ct.npy")
    assert stack.n_planes == 5 and stack.plane_shape == (40, 48)
    results = regularize_stack(str(tmp_path / "ct.npy"), "demo", **FAST)
    direct = regularize_stack(volume, "demo", **FAST)
    assert all(np.array_equal(a.attention, b.attention) for a, b in zip(results, direct))
    assert [i.source.name for i in collect_inputs([str(tmp_path)])] == ["ct.npy"]
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="objects.npy"):
        read_stack(tmp_path / "objects.npy")
