"""An in-memory image of a tiled run is scaled on the run's device, to the host's values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.run.config import RunConfig
from napari_attnreg.core.run.device_scaling import (
    linear_percentiles,
    scale_large,
    scale_on_device,
)
from napari_attnreg.core.run.tiled_engine import prepare_tiled

RNG = np.random.default_rng(11)
IMAGES = {
    "uint8 RGB": RNG.integers(0, 256, (300, 200, 3), dtype=np.uint8),
    "bool": RNG.random((100, 90)) > 0.5,
    "uint16": RNG.gamma(2, 300, (500, 400)).astype(np.uint16),
    "int16": RNG.normal(0, 300, (500, 400)).astype(np.int16),
    "int8": RNG.normal(0, 30, (500, 400)).clip(-128, 127).astype(np.int8),
    "float16, 2 channels": RNG.normal(0, 3, (300, 400, 2)).astype(np.float16),
    "float32": RNG.normal(0, 3, (300, 400)).astype(np.float32),
    "float32, spiky": np.where(RNG.random((300, 400)) < 0.999, 1.0, 5.0).astype(np.float32),
    "uint16, sampled": RNG.gamma(2, 300, (4100, 4200)).astype(np.uint16),  # above 4096²
    "float32, sampled": RNG.normal(0, 3, (4097, 4200)).astype(np.float32),
    "int32 (host)": RNG.integers(-5, 1000, (300, 200), dtype=np.int32),
    "float64 (host)": RNG.normal(0, 3, (300, 200)),
}


def _channels_first(scaled: np.ndarray) -> torch.Tensor:
    chw = torch.from_numpy(scaled)
    return chw[None] if chw.ndim == 2 else chw.permute(2, 0, 1)


def _check_same_as_the_host(arr: np.ndarray, device: str) -> None:
    before = arr.copy()
    host = scale_large(arr)
    source, part = scale_on_device(arr, device)
    assert source.device.type == device and source.dtype == torch.float32
    assert torch.equal(source.cpu(), _channels_first(host))  # bit for bit
    assert np.array_equal(part(1), host) and np.array_equal(part(3), host[::3, ::3])
    assert np.array_equal(arr, before)  # the caller's pixels are never written


@pytest.mark.parametrize("name", list(IMAGES))
def test_the_device_scaling_is_the_host_scaling_bit_for_bit(name):
    _check_same_as_the_host(IMAGES[name], "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on a lent GPU)")
@pytest.mark.parametrize("name", list(IMAGES))
def test_on_a_gpu_the_scaling_is_the_host_scaling_bit_for_bit(name):
    _check_same_as_the_host(IMAGES[name], "cuda")


def test_the_percentiles_are_numpys_for_any_count_and_ties():
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 7, 1000, 12345):
        for k in range(12):
            x = rng.normal(0, 1, n).astype(np.float32)
            if k % 3 == 0:
                x = np.round(x * 3).astype(np.float32)  # ties
            ordered = np.sort(x)
            mine = linear_percentiles(lambda i, o=ordered: float(o[i]), n, (0.5, 99.8))
            assert np.array_equal(mine, np.percentile(x, (0.5, 99.8)))


@pytest.mark.parametrize("arr", [np.full((300, 200), 7, np.uint16),
                                 np.full((4200, 4100), 9, np.uint16),
                                 np.full((50, 60, 3), 3.5, np.float32)])
def test_a_constant_image_is_refused_on_the_device_too(arr):
    with pytest.raises(ValueError, match="constant"):
        scale_on_device(arr, "cpu")


def test_a_tiled_image_in_memory_is_scaled_once_and_its_display_made_only_when_asked(
        monkeypatch):
    from napari_attnreg.core.run import device_scaling

    calls = []
    real = device_scaling.Scaling.on_host
    monkeypatch.setattr(device_scaling.Scaling, "on_host",
                        lambda self, part: calls.append(part.shape) or real(self, part))
    image = IMAGES["uint16"][:496]  # whole patches: tiled at its own size
    demo = load_backbone("demo")
    tiled = prepare_tiled(image, demo, RunConfig(tiled=True, device="cpu", tile_scale=1))
    assert calls == []  # no host copy of the scaled image for the run itself
    assert torch.equal(tiled.source, _channels_first(scale_large(image)))
    assert np.array_equal(tiled.display, scale_large(image)) and calls == [image.shape]
    tiled.display  # noqa: B018 -- made once, kept
    assert calls == [image.shape]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA (run on a lent GPU)"))])
def test_tiles_are_the_crops_at_their_origins(device):
    from napari_attnreg.core.run.tiled_engine import _crops, gathered_crops
    from napari_attnreg.core.run.tiling import make_layout

    source = torch.rand(3, 296, 256, device=device)
    layout = make_layout((296, 256), tile=(128, 128), patch=(8, 8), overlap=32)
    picked = [layout.n_tiles - 1, 0, 3, 3]  # any order, the last (edge) tile, repeats
    origins = np.array([layout.origin(i) for i in picked])
    for crops in (_crops(source, layout, picked), gathered_crops(source, origins, (128, 128))):
        assert crops.shape == (4, 3, 128, 128) and crops.is_contiguous()
        for k, (y, x) in enumerate(origins):
            assert torch.equal(crops[k], source[:, y:y + 128, x:x + 128])


def test_uint16_pixels_widened_on_the_device_keep_their_values():
    # a GPU gets uint16 as the int16 of the same bits (torch's uint16 has few GPU kernels)
    from napari_attnreg.core.run.device_scaling import upload

    pixels = np.array([[0, 1, 32767], [32768, 40000, 65535]], dtype=np.uint16)
    widened = upload(pixels, torch.device("cpu"), widen=True)
    assert widened.dtype == torch.int32
    assert widened.tolist() == pixels.astype(np.int64).tolist()
    assert upload(pixels, torch.device("cpu")).dtype == torch.uint16  # the CPU keeps them


@pytest.mark.parametrize("name", ["uint16", "uint16, sampled"])
def test_widened_uint16_scales_as_the_host_does(monkeypatch, name):
    from napari_attnreg.core.run import device_scaling

    real = device_scaling.upload
    monkeypatch.setattr(device_scaling, "upload",
                        lambda arr, device: real(arr, device, widen=True))
    _check_same_as_the_host(IMAGES[name], "cpu")


@pytest.mark.parametrize("name", ["uint16", "int16", "int8", "float16, 2 channels", "float32",
                                  "float32, spiky"])
def test_every_way_to_the_percentiles_gives_numpys(name):
    from napari_attnreg.core.run.device_scaling import percentiles

    arr = IMAGES[name]
    expected = tuple(float(v) for v in np.percentile(arr.astype(np.float32), (0.5, 99.8)))
    values = torch.from_numpy(arr)
    ways = ["numpy", "sort"] + (["histogram"] if arr.dtype.kind in "iu" else [])
    for by in ways:  # a GPU sorts; a CPU counts integers and asks NumPy for floats
        assert percentiles(values, arr.dtype, by=by) == expected, by
