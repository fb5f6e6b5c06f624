"""Nulls in the image's own channels: calibration on null inputs given as *images*.

A true null input (noise drawn like the bootstrap nulls) goes through the whole preprocessing;
its one-sided p-values must then be uniform, whether the image is grey, RGB or 2-channel. The
old behaviour (independent noise per *model* channel for a grey image) is rebuilt by hand to
show that the check can tell the two apart.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from napari_attnreg.core.models.attention import cls_attention
from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.run.engine import RunConfig, drain, run_engine
from napari_attnreg.core.run.images import ChannelMap, prepare_image
from napari_attnreg.core.run.nulls import NullConfig, null_images
from napari_attnreg.core.stats.directional import directional_statistics

# Many inputs with a modest B: one map's p-values move together, so the pooled KS is
# driven by the number of images more than by B.
N_INPUTS, N_BOOT = 24, 20


@pytest.fixture(scope="module")
def demo():
    return load_backbone("demo")


def null_input(kind: str, index: int, size: int) -> tuple[np.ndarray, dict]:
    """A noise image drawn in its own channels (no object anywhere), as a user would pass it."""
    rng = np.random.default_rng(1000 + index)
    if kind == "grey":
        return rng.normal(0.5, 0.1, (size, size)).astype(np.float32), {}
    if kind == "rgb":
        means = np.array([0.3, 0.5, 0.6])
        return (means + 0.1 * rng.standard_normal((size, size, 3))).astype(np.float32), {}
    return (0.5 + 0.1 * rng.standard_normal((2, size, size))).astype(np.float32), {"channel_axis": 0}


def pooled_pvalues(demo, kind: str) -> tuple[np.ndarray, float]:
    p_all, any_q = [], 0
    size = demo.input_size[1]  # no resize: the input is exactly one draw of the null generator
    for i in range(N_INPUTS):
        image, opts = null_input(kind, i, size)
        res = drain(run_engine(image, demo, RunConfig(n_boot=N_BOOT, seed=i, device="cpu",
                                                      preset="directional", **opts)))
        p_all.append(res.p.ravel())
        any_q += bool((res.q <= 0.1).any())
    return np.concatenate(p_all), any_q / N_INPUTS


@pytest.mark.parametrize("kind", ["grey", "rgb", "two-channel"])
def test_null_images_give_uniform_one_sided_pvalues(demo, kind):
    p, any_significant = pooled_pvalues(demo, kind)
    assert stats.kstest(p, "uniform").statistic <= 0.07  # measured 0.038 / 0.013 / 0.022
    assert any_significant <= 0.2  # FDR at 0.1 over a null map, slack for 24 draws (≤ 0.125)


def test_grey_nulls_drawn_per_model_channel_are_miscalibrated(demo):
    """The old null (colour noise for a grey image) fails the same check."""
    size = demo.input_size[1]
    p_all = []
    with torch.inference_mode():
        for i in range(N_INPUTS):
            image, _ = null_input("grey", i, size)
            prepared = prepare_image(image, patch_size=demo.patch_size, mean=demo.mean,
                                     std=demo.std, default_size=demo.input_size[1:])
            observed = cls_attention(demo, prepared.tensor[None])[0].reshape(-1)
            nulls = null_images(prepared.tensor, range(N_BOOT), NullConfig("normal"), seed=i)
            null_scores = cls_attention(demo, nulls).reshape(N_BOOT, -1)
            p_all.append(directional_statistics(observed, null_scores).p)
    assert stats.kstest(np.concatenate(p_all), "uniform").statistic >= 0.3  # measured 0.61


def test_prepared_image_keeps_own_channels_and_the_map_reproduces_the_tensor(demo):
    grey = np.random.default_rng(0).random((40, 50)).astype(np.float32)
    prepared = prepare_image(grey, patch_size=demo.patch_size, mean=demo.mean, std=demo.std,
                             default_size=demo.input_size[1:])
    assert prepared.source.shape[0] == 1 and prepared.channel_map.kind == "repeat"
    np.testing.assert_array_equal(prepared.channel_map(prepared.source[None])[0], prepared.tensor)
    two = prepare_image(np.stack([grey, grey[::-1]]), patch_size=(8, 8), mean=demo.mean,
                        std=demo.std, channel_axis=0)
    assert two.channel_map.kind == "zero-fill" and two.source.shape[0] == 2
    merged = prepare_image(np.stack([grey, grey], -1).repeat(2, -1), patch_size=(8, 8),
                           mean=demo.mean, std=demo.std, merge="mean")
    assert merged.source.shape[0] == 1
    with pytest.raises(ValueError, match="expected"):
        ChannelMap(1, 3, (0.5,) * 3, (0.2,) * 3)(torch.zeros(1, 3, 8, 8))


def test_grey_image_gets_grey_nulls_through_the_engine(demo, monkeypatch):
    """Every null the backbone sees for a grey image has three identical channels."""
    import napari_attnreg.core.run.engine as engine_mod

    seen = []
    original = engine_mod.cls_attention

    def spy(backbone, images, **kw):
        seen.append(images.clone())
        return original(backbone, images, **kw)

    monkeypatch.setattr(engine_mod, "cls_attention", spy)
    image, _ = null_input("grey", 0, 64)
    for method in ("normal", "uniform", "pixel", "patch"):
        seen.clear()
        drain(run_engine(image, demo, RunConfig(method=method, n_boot=4, device="cpu")))
        nulls = torch.cat(seen)  # the observed image has its own pass (cls_attention_entering)
        assert nulls.shape[0] == 4
        unnormalised = nulls * torch.tensor(demo.std)[:, None, None] + torch.tensor(
            demo.mean)[:, None, None]
        torch.testing.assert_close(unnormalised[:, 0], unnormalised[:, 1], msg=method)
        torch.testing.assert_close(unnormalised[:, 0], unnormalised[:, 2], msg=method)


def test_a_four_channel_model_takes_four_channels_and_says_so_otherwise():
    """Models trained on N channels (cell painting) get exactly N image channels."""
    four = np.random.default_rng(0).random((4, 48, 40)).astype(np.float32)
    kw = {"patch_size": (8, 8), "mean": (0.5,) * 4, "std": (0.25,) * 4}
    prepared = prepare_image(four, channel_axis=0, **kw)
    assert prepared.tensor.shape[0] == 4 and prepared.channel_map.kind == "identity"
    picked = prepare_image(np.concatenate([four, four[:1]]), channel_axis=0,
                           channels=[4, 1, 2, 3], **kw)
    np.testing.assert_array_equal(picked.source[0], prepared.source[0])
    with pytest.raises(ValueError, match="takes 4 channels but the image gives 2"):
        prepare_image(four[:2], channel_axis=0, **kw)
    with pytest.raises(ValueError, match="takes 4 channels but the image gives 1"):
        prepare_image(four[0], **kw)
    with pytest.raises(ValueError, match="choose up to 4"):
        prepare_image(np.concatenate([four, four[:1]]), channel_axis=0, **kw)


@pytest.mark.parametrize("method", ["normal", "uniform", "pixel"])
def test_nulls_drawn_at_the_source_size_match_what_the_resize_does(demo, method):
    """A 320 px noise image is shrunk (and smoothed) to 128 px by the preprocessing, so it is
    a true null only for nulls that went through the same resize (measured on 16 inputs:
    KS 0.017 / 0.013 / 0.018 drawn at the source size, 0.057 / 0.486 / 0.061 at the model's)."""
    ks = {}
    for resolution in ("source", "model"):
        p_all = []
        for i in range(16):
            rng = np.random.default_rng(500 + i)
            image = (rng.uniform(0.2, 0.8, (320, 320)) if method == "uniform"
                     else rng.normal(0.5, 0.1, (320, 320))).astype(np.float32)
            config = RunConfig(n_boot=N_BOOT, seed=i, device="cpu", preset="directional",
                               method=method, null_resolution=resolution)
            p_all.append(drain(run_engine(image, demo, config)).p.ravel())
        ks[resolution] = stats.kstest(np.concatenate(p_all), "uniform").statistic
    assert ks["source"] <= 0.04
    assert ks["model"] >= 1.5 * ks["source"]


def test_stepdown_map_level_p_of_resized_noise_is_not_small(demo):
    """The default (half-patch block nulls from the resized image) on resized noise images:
    the map-level p must not pile up at small values (24 inputs, B = 20)."""
    p_map, anything = [], 0
    for i in range(N_INPUTS):
        image = np.random.default_rng(700 + i).normal(0.5, 0.1, (320, 320)).astype(np.float32)
        res = drain(run_engine(image, demo, RunConfig(n_boot=N_BOOT, seed=i, device="cpu")))
        p_map.append(res.p_map)
        anything += bool(res.significant().any())
    # randomized within the 1/(B + 1) step, the counting p is exactly uniform under the null
    jitter = np.random.default_rng(0).random(N_INPUTS) / (N_BOOT + 1)
    assert stats.kstest(np.asarray(p_map) - jitter, "uniform").pvalue > 0.01
    assert anything <= 4


def test_the_normalisation_is_made_once_per_device_not_per_gpu_chunk():
    # copying the mean and std up for every chunk made the host wait for the chunk before
    from napari_attnreg.core.run.images import ChannelMap, _normalisation

    cmap = ChannelMap(1, 3, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    x = torch.rand(2, 1, 8, 8)
    with torch.inference_mode():
        first = cmap(x)
    again = cmap(x)
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    manual = (x.expand(-1, 3, -1, -1) - torch.tensor([0.5, 0.4, 0.3])[:, None, None]) \
        / torch.tensor([0.2, 0.25, 0.3])[:, None, None]
    torch.testing.assert_close(again, manual, rtol=0, atol=0)
    m, s = _normalisation((0.5, 0.4, 0.3), (0.2, 0.25, 0.3), x.device)
    assert not m.is_inference() and not s.is_inference()
    assert _normalisation.cache_info().hits >= 1
    if torch.cuda.is_available():
        y = x.cuda()
        cmap(y)
        torch.cuda.set_sync_debug_mode("error")
        try:
            cmap(y)  # the second chunk on a GPU: no copy from the host
        finally:
            torch.cuda.set_sync_debug_mode("default")
