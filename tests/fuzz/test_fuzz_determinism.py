"""Fuzz: what the chunk size may and may not change (the engine's Reproducibility paragraph).

Promised across chunk sizes (any ``chunk_size``, an out-of-memory halving, the automatic
size): null images and the observed attention bit-identical; null scores to float32
rounding (rtol 1e-5); z and posterior to 1e-5; a p-value by at most one rank step of its
pool. Promised for a fixed chunk size: everything bit-identical.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import napari_attnreg.core.run.engine as engine_mod
from napari_attnreg import regularize
from napari_attnreg.core.run.nulls import NULL_METHODS, NullConfig, null_images

N_BOOT = 9
BASE = dict(n_boot=N_BOOT, seed=11, device="cpu", target_size=(64, 64), keep_nulls=True)


@pytest.fixture(scope="module")
def image():
    rng = np.random.default_rng(4)
    yy, xx = np.mgrid[0:60, 0:70]
    img = 0.2 + 0.05 * rng.standard_normal((60, 70))
    img += np.exp(-((yy - 20) ** 2 + (xx - 30) ** 2) / 50)
    return img.astype(np.float32)


def _reference(cache, backbone, image, preset, method):
    key = (preset, method)
    if key not in cache:
        cache[key] = regularize(image, backbone, preset=preset, method=method, chunk_size=N_BOOT,
                                **{k: v for k, v in BASE.items()})
    return cache[key]


def assert_within_promise(res, ref):
    np.testing.assert_array_equal(res.attention, ref.attention)
    np.testing.assert_array_equal(res.head_attention, ref.head_attention)
    np.testing.assert_allclose(res.null_scores, ref.null_scores, rtol=1e-5, atol=0)
    np.testing.assert_allclose(res.z, ref.z, rtol=0, atol=1e-5)
    if res.preset == "stepdown":
        # a step p counts null maps: a rounding tie moves it, and the adjusted p after it,
        # by one count 1/(B + 1)
        step = 1 / (N_BOOT + 1)
        for name in ("p", "q", "posterior"):
            assert np.abs(getattr(res, name) - getattr(ref, name)).max() <= step + 1e-12, name
        return
    np.testing.assert_allclose(res.posterior, ref.posterior, rtol=0, atol=1e-5)
    step = 1 / (N_BOOT * res.attention.size)  # one rank of the pooled null
    assert np.abs(res.p - ref.p).max() <= 2 * step


@settings(max_examples=30, deadline=None)
@given(method=st.sampled_from(NULL_METHODS), n=st.integers(1, 12),
       cuts=st.lists(st.integers(1, 12), max_size=6), seed=st.integers(0, 2**62),
       per_channel=st.booleans(), channels=st.sampled_from([1, 3]))
def test_null_images_are_bit_identical_for_any_chunking(method, n, cuts, seed, per_channel,
                                                        channels):
    source = torch.rand(channels, 32, 48, generator=torch.Generator().manual_seed(1))
    config = NullConfig(method, per_channel=per_channel)
    whole = null_images(source, range(n), config, seed=seed, patch_size=16)
    parts, start = [], 0
    for size in [*cuts, n]:
        if start >= n:
            break
        size = min(size, n - start)
        parts.append(null_images(source, range(start, start + size), config, seed=seed,
                                 patch_size=16))
        start += size
    assert torch.equal(torch.cat(parts), whole)


_CACHE: dict = {}


@settings(max_examples=10, deadline=None)
@given(chunk=st.one_of(st.none(), st.integers(1, N_BOOT + 3)),
       preset=st.sampled_from(["stepdown", "directional", "paper"]),
       method=st.sampled_from(["normal", "pixel", "patch"]))
def test_results_across_chunk_sizes_keep_the_promise(tiny_backbone, image, chunk, preset, method):
    ref = _reference(_CACHE, tiny_backbone, image, preset, method)
    res = regularize(image, tiny_backbone, preset=preset, method=method, chunk_size=chunk, **BASE)
    assert_within_promise(res, ref)


@settings(max_examples=4, deadline=None)
@given(chunk=st.integers(1, N_BOOT))
def test_a_fixed_chunk_size_is_bit_identical(tiny_backbone, image, chunk):
    a = regularize(image, tiny_backbone, chunk_size=chunk, **BASE)
    b = regularize(image, tiny_backbone, chunk_size=chunk, **BASE)
    for name in ("attention", "null_scores"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    for name in a.maps:
        np.testing.assert_array_equal(a.maps[name], b.maps[name])


@settings(max_examples=4, deadline=None)
@given(fits=st.integers(1, 4))
def test_out_of_memory_halving_keeps_the_promise(tiny_backbone, image, fits):
    """A chunk above ``fits`` images runs out of memory; the halved run stays within promise."""
    ref = _reference(_CACHE, tiny_backbone, image, "directional", "normal")
    real = engine_mod.cls_attention

    def small_memory(bb, images, **kw):
        if images.shape[0] > fits:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return real(bb, images, **kw)

    engine_mod.cls_attention = small_memory
    try:
        events = []
        res = regularize(image, tiny_backbone, chunk_size=N_BOOT, progress=events.append,
                         preset="directional", **BASE)
    finally:
        engine_mod.cls_attention = real
    assert res.metadata["chunk_size"] <= fits and any("halved" in e.message for e in events)
    assert_within_promise(res, ref)
