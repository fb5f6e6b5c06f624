"""Bootstrap null generators: their definitions (docs/method.md), seeding, chunk invariance."""

from __future__ import annotations

import pytest
import torch

from napari_attnreg.core.run.nulls import NullConfig, null_images


@pytest.fixture
def image():
    torch.manual_seed(0)
    x = torch.randn(3, 32, 48)
    x[0] += 2.0
    x[1] *= 3.0
    return x


@pytest.mark.parametrize("method", ["normal", "uniform", "pixel", "patch"])
def test_seeded_and_chunk_invariant(image, method):
    cfg = NullConfig(method)
    whole = null_images(image, range(8), cfg, seed=5, patch_size=8)
    parts = torch.cat([null_images(image, range(0, 3), cfg, seed=5, patch_size=8),
                       null_images(image, range(3, 8), cfg, seed=5, patch_size=8)])
    assert whole.shape == (8, 3, 32, 48)
    torch.testing.assert_close(whole, parts, rtol=0, atol=0)
    other = null_images(image, range(8), cfg, seed=6, patch_size=8)
    assert not torch.equal(whole, other)
    assert not torch.equal(whole[0], whole[1])


def test_normal_matches_channel_moments(image):
    nulls = null_images(image, range(64), NullConfig("normal"), seed=0)
    for c in range(3):
        assert abs(nulls[:, c].mean() - image[c].mean()) < 0.05 * image[c].std()
        assert abs(nulls[:, c].std() / image[c].std(unbiased=False) - 1) < 0.02
    glob = null_images(image, range(16), NullConfig("normal", per_channel=False), seed=0)
    assert abs(glob.mean() - image.mean()) < 0.05
    wide = null_images(image, range(16), NullConfig("normal", std_factor=2.0), seed=0)
    assert abs(wide[:, 1].std() / image[1].std(unbiased=False) - 2) < 0.05


def test_uniform_bounds_from_normalised_image(image):
    nulls = null_images(image, range(16), NullConfig("uniform"), seed=0)
    for c in range(3):
        assert nulls[:, c].min() >= image[c].min() and nulls[:, c].max() <= image[c].max()


def test_pixel_resamples_whole_pixel_vectors(image):
    nulls = null_images(image, range(4), NullConfig("pixel"), seed=0)
    pixels = {tuple(v.tolist()) for v in image.reshape(3, -1).T}
    for v in nulls[0].reshape(3, -1).T[:200]:
        assert tuple(v.tolist()) in pixels


def test_patch_permutes_blocks(image):
    nulls = null_images(image, range(2), NullConfig("patch"), seed=0, patch_size=8)

    def blocks(x):
        return sorted(tuple(x[:, i:i + 8, j:j + 8].flatten().tolist())
                      for i in range(0, 32, 8) for j in range(0, 48, 8))

    assert blocks(nulls[0]) == blocks(image)
    assert not torch.equal(nulls[0], image)
    with pytest.raises(ValueError, match="multiples of the block"):
        null_images(image, range(1), NullConfig("patch", block_size=5), seed=0)


def test_bad_config():
    with pytest.raises(ValueError, match="Unknown bootstrap method"):
        NullConfig("gaussian")
    with pytest.raises(ValueError, match="std_factor"):
        NullConfig("normal", std_factor=0)


@pytest.mark.parametrize("method", ["normal", "uniform", "pixel", "patch"])
def test_a_chunk_is_drawn_without_a_generator_per_image(image, method, monkeypatch):
    # a generator per null image meant a launch per null image on a GPU
    def no_generator(*args, **kwargs):
        raise AssertionError("a torch.Generator was made")

    monkeypatch.setattr(torch, "Generator", no_generator)
    nulls = null_images(image, range(20), NullConfig(method), seed=1, patch_size=8)
    assert nulls.shape == (20, 3, 32, 48)


def test_counter_based_draws_have_their_distributions():
    from scipy import stats

    from napari_attnreg.core.run.nulls import (
        integer_draws,
        normal_draws,
        permutation_draws,
        uniform_draws,
    )

    u = uniform_draws(3, range(4), (50_000,), "cpu").double()
    assert 0 <= float(u.min()) and float(u.max()) < 1
    assert stats.kstest(u.reshape(-1).numpy(), "uniform").pvalue > 0.001
    z = normal_draws(3, range(4), (50_000,), "cpu").double().reshape(-1).numpy()
    assert stats.kstest(z, "norm").pvalue > 0.001
    assert abs(stats.kurtosis(z)) < 0.05
    k = integer_draws(3, range(4), 60_000, 6, "cpu")
    assert set(k.unique().tolist()) == set(range(6))
    assert stats.chisquare(torch.bincount(k.reshape(-1)).numpy()).pvalue > 0.001
    perms = permutation_draws(3, range(2000), 5, "cpu")
    assert torch.equal(perms.sort(dim=1).values, torch.arange(5).expand(2000, 5))
    first = torch.bincount(perms[:, 0], minlength=5).numpy()
    assert stats.chisquare(first).pvalue > 0.001
    # neighbouring images and streams do not repeat one another
    assert not torch.equal(uniform_draws(3, [0], (64,), "cpu"), uniform_draws(3, [1], (64,), "cpu"))


@pytest.mark.parametrize("method", ["normal", "uniform", "pixel", "patch"])
def test_draws_do_not_depend_on_the_work_block(image, method, monkeypatch):
    import napari_attnreg.core.run.nulls as nulls_mod

    whole = null_images(image, range(5), NullConfig(method), seed=2, patch_size=8)
    # blocks smaller than one image: each image's values in column blocks
    monkeypatch.setitem(nulls_mod.DRAW_BLOCK_VALUES, "cpu", 1000)
    torch.testing.assert_close(null_images(image, range(5), NullConfig(method), seed=2,
                                           patch_size=8), whole, rtol=0, atol=0)


@pytest.mark.parametrize("seed", [0, 7, 2**63 - 1, 2**64 - 1, -5])
def test_keys_made_on_the_device_are_the_host_keys(image, seed):
    # the engines pass ranges, keyed on the device so that no chunk waits for the one before;
    # the null images must be those of the per-index host keys, bit for bit
    from napari_attnreg.core.run.nulls import _image_keys, _signed, image_seed

    for indices in (range(0, 300), range(999, 1003), range(2**40, 2**40 + 4), range(3, 90, 7)):
        for stream in (0, 0x243F6A8885A308D3, 0x13198A2E03707344):
            host = torch.tensor([_signed(image_seed(seed, i) ^ stream) for i in indices])
            assert torch.equal(_image_keys(seed, indices, "cpu", stream), host)
    for method in ("normal", "uniform", "pixel", "patch"):
        as_range = null_images(image, range(3, 9), NullConfig(method), seed=seed, patch_size=8)
        as_list = null_images(image, list(range(3, 9)), NullConfig(method), seed=seed,
                              patch_size=8)
        torch.testing.assert_close(as_range, as_list, rtol=0, atol=0)


def test_a_range_of_null_images_is_keyed_without_the_host_loop(image, monkeypatch):
    import napari_attnreg.core.run.nulls as nulls_mod

    want = {m: null_images(image, range(4), NullConfig(m), seed=3, patch_size=8)
            for m in ("normal", "uniform", "pixel", "patch")}

    def host_keys(*args):
        raise AssertionError("a range was keyed on the host")

    monkeypatch.setattr(nulls_mod, "image_seed", host_keys)
    for method, nulls in want.items():
        got = null_images(image, range(4), NullConfig(method), seed=3, patch_size=8)
        torch.testing.assert_close(got, nulls, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on a lent GPU)")
@pytest.mark.parametrize("method", ["normal", "uniform", "pixel", "patch"])
def test_on_a_gpu_the_nulls_are_keyed_as_on_the_host_and_chunk_invariant(image, method):
    from napari_attnreg.core.run.nulls import _image_keys, _signed, image_seed

    for stream in (0, 0x13198A2E03707344):
        host = torch.tensor([_signed(image_seed(9, i) ^ stream) for i in range(500, 900)])
        assert torch.equal(_image_keys(9, range(500, 900), "cuda", stream).cpu(), host)
    gpu = image.cuda()
    cfg = NullConfig(method)
    torch.cuda.set_sync_debug_mode("error")  # a chunk's draws must never wait for the device
    try:
        whole = null_images(gpu, range(40), cfg, seed=9, patch_size=8)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    parts = torch.cat([null_images(gpu, range(0, 7), cfg, seed=9, patch_size=8),
                       null_images(gpu, range(7, 40), cfg, seed=9, patch_size=8)])
    torch.testing.assert_close(whole, parts, rtol=0, atol=0)
    listed = null_images(gpu, list(range(40)), cfg, seed=9, patch_size=8)
    torch.testing.assert_close(whole, listed, rtol=0, atol=0)
