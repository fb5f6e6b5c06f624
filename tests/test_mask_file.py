"""A user's mask file at a slide's full resolution: read a band at a time, one bit per pixel,
with the same tiles, glass tokens, display copy and nulls as the mask read whole."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

tifffile = pytest.importorskip("tifffile")
pytest.importorskip("zarr")

from napari_attnreg.core.run import mask_file  # noqa: E402
from napari_attnreg.core.run.mask_file import PackedMask  # noqa: E402
from napari_attnreg.core.run.tiling import _tissue_pixels, make_layout  # noqa: E402
from napari_attnreg.core.run.tissue import (  # noqa: E402
    glass_tokens,
    read_mask,
    stored_mask,
    tiles_in_tissue,
)


def _packed(mask: np.ndarray) -> PackedMask:
    return PackedMask(np.packbits(mask, axis=1), mask.shape[1])


@pytest.fixture
def small_budget(monkeypatch):
    """Every mask file is 'large', read in bands of a few rows (several bands per file)."""
    monkeypatch.setattr(mask_file, "PACKED_MASK_PIXELS", 0)
    monkeypatch.setattr(mask_file, "BAND_PIXELS", 1000)


def test_a_packed_mask_answers_every_index_its_readers_use_as_the_array_does():
    rng = np.random.default_rng(3)
    mask = rng.random((37, 53)) < 0.4  # a width that is no multiple of 8
    packed = _packed(mask)
    assert packed.shape == mask.shape and len(packed) == 37
    np.testing.assert_array_equal(np.asarray(packed), mask)
    for key in [slice(3, 9), slice(30, 80), slice(5, 5), (slice(2, 7), slice(4, 50)),
                (slice(None, None, 4), slice(None, None, 3)), (slice(1, None, 5), slice(2, 9)),
                np.ix_(np.array([0, 5, 5, 36]), np.array([52, 0, 7, 8])),
                (np.array([3, 1, 3]), slice(None)), (4, slice(None)), (4, np.array([1, 2]))]:
        np.testing.assert_array_equal(packed[key], mask[key])
    for y, x in [(0, 0), (36, 52), (10, 7), (10, 8), (-1, -1), (np.int64(5), np.int64(40))]:
        assert packed[y, x] is bool(mask[y, x])


def _write(path, array, **options):
    if path.suffix == ".npy":
        np.save(path, array)
    else:
        tifffile.imwrite(path, array, **options)
    return path


def _mask_files(tmp_path):
    rng = np.random.default_rng(0)
    labels = (rng.random((96, 130)) < 0.3).astype(np.uint8) * rng.integers(1, 5, (96, 130),
                                                                              dtype=np.uint8)
    rgb = np.zeros((96, 130, 3), np.uint8)
    rgb[10:50, 20:90, 1] = 200
    alpha = np.zeros((96, 130, 4), np.uint8)
    alpha[30:70, 5:60, 3] = 255
    coloured = alpha.copy()
    coloured[0:5, 0:5, 0] = 9  # some colour: the colour, not the alpha, is the mask
    probability = rng.random((96, 130)).astype(np.float32)
    probability[0, :7] = np.nan
    float_labels = (labels > 0).astype(np.float64) * 2.0  # floats, but no values between 0 and 1
    return {
        "tiled.tif": _write(tmp_path / "tiled.tif", labels, tile=(32, 32), compression="zlib"),
        "striped.tif": _write(tmp_path / "striped.tif", labels, rowsperstrip=7),
        "rgb.tif": _write(tmp_path / "rgb.tif", rgb, photometric="rgb", tile=(32, 32)),
        "alpha.tif": _write(tmp_path / "alpha.tif", alpha, photometric="rgb", extrasamples=[2]),
        "coloured.tif": _write(tmp_path / "coloured.tif", coloured, photometric="rgb",
                               extrasamples=[2]),
        "lead.npy": _write(tmp_path / "lead.npy", labels[None]),
        "trail.npy": _write(tmp_path / "trail.npy", labels[..., None]),
        "bool.npy": _write(tmp_path / "bool.npy", labels > 1),
        "probability.npy": _write(tmp_path / "probability.npy", probability),
        "probability.tif": _write(tmp_path / "probability.tif", probability, tile=(16, 16)),
        "float_labels.npy": _write(tmp_path / "float_labels.npy", float_labels),
        "pyramid.ome.tif": _pyramid(tmp_path / "pyramid.ome.tif", labels),
    }


def _pyramid(path, labels):
    """A label image as QuPath exports one: an OME-TIFF pyramid, TCZYX, level 0 first."""
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(labels[None, None, None], subifds=1, tile=(32, 32),
                  metadata={"axes": "TCZYX"})
        tif.write(labels[::2, ::2][None, None, None], subfiletype=1, tile=(32, 32))
    return path


def test_a_large_mask_file_is_read_as_the_same_mask_one_bit_per_pixel(tmp_path, monkeypatch):
    files = _mask_files(tmp_path)
    whole = {name: read_mask(path) for name, path in files.items()}
    monkeypatch.setattr(mask_file, "PACKED_MASK_PIXELS", 0)
    monkeypatch.setattr(mask_file, "BAND_PIXELS", 1000)
    for name, path in files.items():
        packed, source = read_mask(path)
        assert isinstance(packed, PackedMask), name
        assert source == whole[name][1], name
        np.testing.assert_array_equal(np.asarray(packed), whole[name][0], err_msg=name)
    assert whole["probability.npy"][1].endswith("(probability ≥ 0.5)")
    assert not whole["float_labels.npy"][1].endswith("(probability ≥ 0.5)")


def test_without_zarr_a_large_tiff_mask_is_read_whole_as_before(tmp_path, small_budget,
                                                                  monkeypatch):
    labels = np.zeros((40, 50), np.uint8)
    labels[5:20, 10:30] = 3
    path = _write(tmp_path / "m.tif", labels, tile=(16, 16))
    monkeypatch.setattr(mask_file, "_zarr_installed", lambda: False)
    mask, source = read_mask(path)
    assert isinstance(mask, np.ndarray) and source == "file m.tif"
    np.testing.assert_array_equal(mask, labels > 0)


def test_a_large_file_that_is_no_mask_is_refused_with_its_shape(tmp_path, small_budget):
    path = _write(tmp_path / "stack.npy", np.ones((2, 40, 50), np.uint8))
    with pytest.raises(ValueError, match=r"2D mask.*\(2, 40, 50\).*stack\.npy"):
        read_mask(path)


def test_the_tiles_glass_display_copy_and_null_pixels_of_a_packed_mask_are_the_masks(tmp_path):
    rng = np.random.default_rng(1)
    mask = np.zeros((900, 1100), bool)
    mask[100:700, 150:800] = True
    mask[rng.integers(0, 900, 400), rng.integers(0, 1100, 400)] = True  # specks
    packed = _packed(mask)
    layout = make_layout((448, 552), tile=(64, 64), patch=(8, 8), overlap=16)
    for fraction in (0.05, 0.5):
        np.testing.assert_array_equal(tiles_in_tissue(packed, layout, fraction),
                                      tiles_in_tissue(mask, layout, fraction))
    np.testing.assert_array_equal(glass_tokens(packed, layout), glass_tokens(mask, layout))
    for most in (None, 1000, 10**7):
        np.testing.assert_array_equal(stored_mask(packed, most), stored_mask(mask, most))
    import torch

    source = torch.rand((3, 448, 552))
    torch.testing.assert_close(_tissue_pixels(source, packed), _tissue_pixels(source, mask),
                               rtol=0, atol=0)


def test_a_run_with_a_large_mask_file_gives_the_result_of_the_mask_read_whole(tmp_path,
                                                                                 monkeypatch):
    from napari_attnreg import regularize

    rng = np.random.default_rng(2)
    image = rng.random((512, 512)).astype(np.float32)
    mask = np.zeros((1024, 1024), np.uint8)  # at twice the image's resolution
    mask[200:800, 100:700] = 255
    path = _write(tmp_path / "mask.tif", mask, tile=(128, 128), compression="zlib")

    def run(**options):
        return regularize(image, "demo", tiled=True, n_boot=16, seed=0, device="cpu",
                          tissue_mask=str(path), **options)

    for options in ({}, {"preset": "paper"}):
        whole = run(**options)
        with monkeypatch.context() as patched:
            patched.setattr(mask_file, "PACKED_MASK_PIXELS", 0)
            patched.setattr(mask_file, "BAND_PIXELS", 5000)
            packed = run(**options)
        assert packed.metadata["tissue_mask"] == whole.metadata["tissue_mask"] == "file mask.tif"
        assert packed.metadata["n_tissue_tiles"] == whole.metadata["n_tissue_tiles"]
        assert packed.metadata["n_glass_tokens"] == whole.metadata["n_glass_tokens"] > 0
        np.testing.assert_array_equal(packed.p, whole.p)
        np.testing.assert_array_equal(packed.null_summary["tissue_mask"],
                                      whole.null_summary["tissue_mask"])


def test_reading_a_large_mask_file_holds_a_bit_per_pixel_not_the_image(tmp_path, monkeypatch):
    mask = np.zeros((4096, 4096), np.uint8)
    mask[1000:3000, 500:3500] = 1
    path = _write(tmp_path / "big.tif", mask, tile=(256, 256), compression="zlib")
    del mask

    def peak_of_reading() -> tuple[int, object]:
        tracemalloc.start()
        try:
            read, _ = read_mask(path)
            return tracemalloc.get_traced_memory()[1], read
        finally:
            tracemalloc.stop()

    whole_peak, whole = peak_of_reading()
    assert whole_peak >= 2 * 4096 * 4096  # the pixels and the boolean image beside them
    monkeypatch.setattr(mask_file, "PACKED_MASK_PIXELS", 1 << 20)
    monkeypatch.setattr(mask_file, "BAND_PIXELS", 1 << 20)
    packed_peak, packed = peak_of_reading()
    assert isinstance(packed, PackedMask) and packed.nbytes == 4096 * 512
    assert packed_peak < 6 * 2**20, packed_peak  # 2 MiB of bits, bands of 1 M pixels
    np.testing.assert_array_equal(np.asarray(packed), whole)
