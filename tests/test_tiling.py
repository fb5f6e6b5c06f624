"""Tiled native-resolution runs: layout, image-level null, engine hook, geometry, cancel."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import timm
import torch
from torch import nn

import napari_attnreg.core.run.tiled_engine as tiled_mod
from napari_attnreg import AttentionResult, regularize
from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.run.engine import CancelToken, RunCancelled, RunConfig, run_engine
from napari_attnreg.core.run.nulls import NullConfig, null_images
from napari_attnreg.core.run.tiling import ImageNull, make_layout
from napari_attnreg.testing.synthetic import TRAINING_SCALE, make_cell_image

QUIET = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def demo():
    return load_backbone("demo")


def brightness_vit(gain: float = 8.0):
    """One-block ViT whose CLS attention is softmax(gain · mean patch intensity).

    Its attention provably follows brightness, so where a planted bright object must show
    up is known exactly; 64 px input, 8 px patches.
    """
    m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, patch_size=8,
                          embed_dim=16, depth=1, num_heads=1)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        m.patch_embed.proj.weight[0] = 1.0 / (3 * 64)  # token dim 0: mean patch intensity
        m.cls_token[0, 0, 1] = 1.0
        m.blocks[0].norm1 = nn.Identity()  # keep the intensity's scale in the keys
        m.blocks[0].attn.qkv.weight[0, 1] = gain  # q_cls = gain along dim 0 of the keys
        m.blocks[0].attn.qkv.weight[16, 0] = 1.0  # k = mean patch intensity
    m.eval()
    return dataclasses.replace(load_backbone(m), input_size=(3, 64, 64))


@pytest.mark.parametrize("shape,tile,overlap", [((128, 128), (128, 128), 0), ((304, 200), (128, 128), 0),
                                                ((304, 200), (128, 128), 32), ((64, 40), (128, 128), 0),
                                                ((96, 520), (64, 48), 16)])
def test_tiles_cover_the_image_exactly(shape, tile, overlap):
    lay = make_layout(shape, tile=tile, patch=(8, 8), overlap=overlap)
    covered = np.zeros(shape, int)
    for i in range(lay.n_tiles):
        y, x = lay.origin(i)
        assert y % 8 == 0 and x % 8 == 0 and y + lay.tile[0] <= shape[0] and x + lay.tile[1] <= shape[1]
        covered[y:y + lay.tile[0], x:x + lay.tile[1]] += 1
    assert covered.min() >= 1
    if overlap == 0 and all(s % t == 0 for s, t in zip(shape, lay.tile)):
        assert covered.max() == 1
    # every token is read from a tile that contains it, at the right place inside that tile
    tiles, local = lay.tile_index(), lay.local_index()
    tgw = lay.tile_grid[1]
    for gy in range(lay.grid_shape[0]):
        for gx in range(lay.grid_shape[1]):
            y, x = lay.origin(tiles[gy, gx])
            ly, lx = divmod(int(local[gy, gx]), tgw)
            assert (y // 8 + ly, x // 8 + lx) == (gy, gx)


def test_overlap_takes_the_tile_whose_centre_is_nearest():
    lay = make_layout((304, 232), tile=(128, 128), patch=(8, 8), overlap=48)
    centres = np.array([(y + 64, x + 64) for y, x in (lay.origin(i) for i in range(lay.n_tiles))])
    tiles = lay.tile_index()
    for gy in range(lay.grid_shape[0]):
        for gx in range(lay.grid_shape[1]):
            token = np.array([gy * 8 + 4, gx * 8 + 4])
            dist = np.hypot(*(centres - token).T)
            assert dist[tiles[gy, gx]] == dist.min()
    # assemble reads each token from that tile: a map that differs per tile shows which
    per_tile = np.arange(lay.n_tiles, dtype=float)[:, None, None] * np.ones((1, 16, 16))
    np.testing.assert_array_equal(lay.assemble(per_tile), tiles)


def test_layout_rejects_bad_overlap():
    with pytest.raises(ValueError, match="multiple of the patch"):
        make_layout((256, 256), tile=(128, 128), patch=(8, 8), overlap=12)
    with pytest.raises(ValueError, match="smaller than the tile"):
        make_layout((256, 256), tile=(128, 128), patch=(8, 8), overlap=128)
    with pytest.raises(ValueError, match="null_scope applies to tiled runs only"):
        RunConfig(null_scope="image").validate()
    with pytest.raises(ValueError, match="tile_scale"):
        RunConfig(tiled=True, tile_scale=0).validate()
    with pytest.raises(ValueError, match="null_scope='tiles' is not supported"):
        RunConfig(tiled=True, null_scope="tiles").validate()


def test_image_null_takes_its_statistics_from_the_whole_image():
    src = torch.zeros(1, 64, 256)
    src[:, :, 128:] = 1.0  # left half dark, right half bright
    tiles = ImageNull(src, NullConfig("normal"), (64, 64), 8).draw(range(20), seed=0)
    assert tiles.shape == (20, 1, 64, 64)
    assert abs(float(tiles.mean()) - 0.5) < 0.01 and abs(float(tiles.std()) - 0.5) < 0.01
    pix = ImageNull(src, NullConfig("pixel"), (64, 64), 8).draw(range(20), seed=0)
    assert abs(float(pix.mean()) - 0.5) < 0.02 and set(pix.unique().tolist()) == {0.0, 1.0}
    # patch: whole blocks of one randomly placed tile, so both halves turn up across draws
    patches = ImageNull(src, NullConfig("patch"), (64, 64), 8).draw(range(30), seed=0)
    means = patches.mean(dim=(1, 2, 3))
    assert float(means.min()) < 0.5 < float(means.max())
    # one tile == the whole image: exactly the untiled draws
    one = ImageNull(src[:, :, :64], NullConfig("patch"), (64, 64), 8).draw(range(5), seed=3)
    assert torch.equal(one, null_images(src[:, :, :64], range(5), NullConfig("patch"), seed=3,
                                        patch_size=8))


@QUIET
@pytest.mark.parametrize("preset", ["directional", "paper"])
@pytest.mark.parametrize("method", ["normal", "patch"])
def test_an_image_that_is_one_tile_gives_the_untiled_result(demo, preset, method):
    image = make_cell_image(3, size=128, abnormal=True).image
    opts = {"n_boot": 12, "chunk_size": 5, "device": "cpu", "preset": preset, "method": method}
    untiled = regularize(image, demo, **opts)
    tiled = regularize(image, demo, tiled=True, **opts)
    for name in ("attention", "z", "p", "lfdr", "posterior", "q", "head_attention"):
        np.testing.assert_array_equal(getattr(tiled, name), getattr(untiled, name), err_msg=name)
    assert tiled.pi0 == untiled.pi0 and tiled.token_scale == untiled.token_scale
    assert tiled.metadata["n_tiles"] == 1 and tiled.metadata["tiled"] is True


@QUIET
@pytest.mark.parametrize("scope,expected", [("image", lambda n, b: n + b),
                                            ("tile", lambda n, b: n * (1 + b))])
def test_forward_passes_are_counted(demo, monkeypatch, scope, expected):
    images_seen = []
    real = tiled_mod.cls_attention

    def spy(backbone, x, **kw):
        images_seen.append(int(x.shape[0]))
        return real(backbone, x, **kw)

    monkeypatch.setattr(tiled_mod, "cls_attention", spy)
    image = make_cell_image(1, size=(300, 260), scale=TRAINING_SCALE).image
    events = []
    res = regularize(image, demo, n_boot=7, chunk_size=4, device="cpu", tiled=True,
                     tile_overlap=0, null_scope=scope, progress=events.append)
    n_tiles = res.metadata["n_tiles"]
    assert n_tiles == 3 * 2  # 304 x 256 px in 128 px tiles, the last row flush with the edge
    assert sum(images_seen) == expected(n_tiles, 7) == res.metadata["forward_passes"]
    assert max(images_seen) <= 4  # tiles and nulls both go in chunks
    assert events[0].stage == "observed" and events[-1].stage == "statistics"
    assert events[-1].total == expected(n_tiles, 7)
    assert all(a.done <= b.done for a, b in itertools.pairwise(events))


@QUIET
def test_cancel_inside_a_tiled_run(demo, monkeypatch):
    calls = []
    real = tiled_mod.cls_attention
    monkeypatch.setattr(tiled_mod, "cls_attention",
                        lambda bb, x, **kw: calls.append(x.shape[0]) or real(bb, x, **kw))
    image = make_cell_image(2, size=(384, 384), scale=TRAINING_SCALE).image
    for stop_stage in ("observed", "nulls"):
        calls.clear()
        token = CancelToken()
        gen = run_engine(image, demo, RunConfig(tiled=True, tile_overlap=0, n_boot=20, chunk_size=3,
                                                device="cpu"),
                         token)
        with pytest.raises(RunCancelled):
            for event in gen:
                if event.stage == stop_stage:
                    token.cancel()
        # it stopped at the next chunk boundary: one chunk of work after the cancel at most
        assert sum(calls) == (3 if stop_stage == "observed" else 9 + 3)


@QUIET
@pytest.mark.parametrize("preset", ["directional", "paper"])
def test_a_planted_bright_object_is_found_at_its_place(preset):
    bb = brightness_vit()
    yy, xx = np.mgrid[:300, :260]
    for seed in range(2):
        image = make_cell_image([8, seed], size=(300, 260), scale=TRAINING_SCALE, abnormal=False).image
        image = image.astype(np.float32)
        cy, cx = np.random.default_rng(seed).integers(20, [280, 240])
        disk = (yy - cy) ** 2 + (xx - cx) ** 2 <= 6 ** 2
        image[disk] = image.max() * 4
        res = regularize(image, bb, n_boot=40, chunk_size=16, device="cpu", tiled=True,
                         tile_overlap=16, preset=preset)
        assert res.metadata["n_tiles"] > 20 and res.image_shape == (300, 260)
        on_disk = res.token_coverage(disk) > 0.5
        assert on_disk.any()
        assert on_disk[np.unravel_index(np.argmax(res.z), res.grid_shape)]
        assert res.significant()[on_disk].all()
        assert res.p[on_disk].max() <= res.p.min() + 1e-12  # the smallest p-values in the image


@QUIET
def test_geometry_scale_and_saved_result(demo, tmp_path):
    image = make_cell_image(4, size=(300, 260), scale=TRAINING_SCALE).image
    native = regularize(image, demo, n_boot=6, device="cpu", tiled=True, tile_overlap=16)
    assert native.model_shape == (304, 256) and native.grid_shape == (38, 32)
    np.testing.assert_allclose(native.token_scale, (8 * 300 / 304, 8 * 260 / 256))
    assert native.to_pixels(native.p).shape == (300, 260)
    half = regularize(image, demo, n_boot=6, device="cpu", tiled=True, tile_scale=2.0)
    assert half.model_shape == (152, 128) and half.grid_shape == (19, 16)
    np.testing.assert_allclose(half.token_scale, (8 * 300 / 152, 8 * 260 / 128))
    again = AttentionResult.load(native.save(tmp_path / "tiled.npz"))
    assert again == native and again.metadata["tile_shape"] == [128, 128]
    kept = regularize(image, demo, n_boot=4, device="cpu", tiled=True, null_scope="tile",
                      preset="directional", null_pool="position", keep_nulls=True)
    assert kept.null_scores.shape == (4, 38, 32) and np.isfinite(kept.p).all()


def test_large_images_are_scaled_in_one_copy_like_small_ones():
    from napari_attnreg.core.run.device_scaling import scale_large
    from napari_attnreg.core.run.images import scale_intensity

    rng = np.random.default_rng(0)
    small = (rng.random((300, 200)) * 4000).astype(np.uint16)
    np.testing.assert_array_equal(scale_large(small), scale_intensity(small))
    big = rng.gamma(2.0, 300, size=(4200, 4100)).astype(np.uint16)  # 17 M pixels: sampled
    np.testing.assert_allclose(scale_large(big), scale_intensity(big), atol=3e-3)
    with pytest.raises(ValueError, match="constant"):
        scale_large(np.full((4200, 4100), 9, np.uint16))


@QUIET
def test_cpu_chunks_are_sized_for_about_a_second(demo):
    from napari_attnreg.core.run.tiled_engine import latency_chunk

    assert 16 <= latency_chunk(demo, (128, 128)) <= 64  # ~30 ms per demo tile on a laptop core
    assert latency_chunk(demo, (256, 256)) < latency_chunk(demo, (128, 128)) / 4
    image = make_cell_image(1, size=(256, 256), scale=TRAINING_SCALE).image
    res = regularize(image, demo, n_boot=4, device="cpu", tiled=True, tile_scale=2.0)
    # the untiled CPU cap of 32 images does not apply: a small model's tiles are cheap
    assert res.metadata["chunk_size"] == latency_chunk(demo, (128, 128))


def test_cpu_chunks_of_a_large_model_hold_several_tiles():
    # a ViT-S/16's tile costs about 9 GFLOP: the one-second bound alone gave 2 tiles a chunk,
    # a ViT-B/16's 1, and a CPU runs one image at a time well below its batched rate
    import timm

    from napari_attnreg.core.models.backbones import load_backbone
    from napari_attnreg.core.run.config import RunConfig
    from napari_attnreg.core.run.tiled_engine import (
        CPU_EFFICIENT_CHUNK,
        latency_chunk,
        tiled_chunk_size,
    )

    cpu = torch.device("cpu")
    for name in ("vit_small_patch16_224", "vit_base_patch16_224"):
        backbone = load_backbone(timm.create_model(name, pretrained=False, num_classes=0))
        assert latency_chunk(backbone, (224, 224)) < CPU_EFFICIENT_CHUNK
        assert tiled_chunk_size(RunConfig(tiled=True), backbone, (224, 224), cpu,
                                None) == CPU_EFFICIENT_CHUNK


def test_untiled_cpu_chunks_of_a_large_model_hold_a_seconds_work(demo):
    # an untiled run took 32 images a chunk whatever the model: a ViT-S/16 or DINOv2 ran
    # about a fifth slower than in chunks of 4 on a CPU; the demo model keeps its 32
    import timm

    from napari_attnreg.core.models.backbones import load_backbone
    from napari_attnreg.core.run.config import CPU_EFFICIENT_CHUNK, CPU_MAX_CHUNK, auto_chunk_size

    cpu = torch.device("cpu")
    vits = load_backbone(timm.create_model("vit_small_patch16_224", pretrained=False,
                                           num_classes=0))
    assert auto_chunk_size(vits, (224, 224), cpu, None) == CPU_EFFICIENT_CHUNK
    assert auto_chunk_size(demo, tuple(demo.input_size[1:]), cpu, None) == CPU_MAX_CHUNK
    image = make_cell_image(1, size=(128, 128), scale=TRAINING_SCALE).image
    assert regularize(image, demo, n_boot=40, device="cpu").metadata["chunk_size"] == 32


def test_gpu_tile_chunks_come_from_the_memory_budget(demo, monkeypatch):
    from napari_attnreg.core.run.config import RunConfig
    from napari_attnreg.core.run.tiled_engine import TILED_MAX_CHUNK, tiled_chunk_size

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 << 30, 80 << 30))
    cuda = torch.device("cuda")
    config = RunConfig(tiled=True)
    assert tiled_chunk_size(config, demo, (128, 128), cuda, torch.bfloat16) == TILED_MAX_CHUNK
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 << 30, 80 << 30))
    assert 32 < tiled_chunk_size(config, demo, (128, 128), cuda, torch.bfloat16) < TILED_MAX_CHUNK
    assert tiled_chunk_size(RunConfig(tiled=True, chunk_size=7), demo, (128, 128), cuda,
                            None) == 7


@QUIET
def test_out_of_memory_halves_the_chunk_in_a_tiled_run(demo, monkeypatch):
    real = tiled_mod.cls_attention

    def small_memory(backbone, x, **kw):
        if x.shape[0] > 2:
            raise RuntimeError("CUDA out of memory (simulated)")
        return real(backbone, x, **kw)

    monkeypatch.setattr(tiled_mod, "cls_attention", small_memory)
    image = make_cell_image(1, size=(300, 260), scale=TRAINING_SCALE).image
    events = []
    res = regularize(image, demo, n_boot=6, chunk_size=8, device="cpu", tiled=True, tile_overlap=0,
                     progress=events.append)
    halved = [e.message for e in events if "out of memory" in e.message]
    assert halved == ["out of memory: chunk size halved to 3",
                      "out of memory: chunk size halved to 1"]  # 8 → 6 tiles: 6 → 3 → 1
    assert res.metadata["chunk_size"] == 1 and np.isfinite(res.p).all()


@QUIET
@pytest.mark.parametrize("scope", ["image", "tile"])
def test_stepdown_tiles_are_families_and_any_tile_can_keep_a_token(demo, scope):
    """Each tile is a family (its own steps, its own map-level p); a token in the overlap of
    several tiles is significant where any of them keeps it, and its evidence is its best."""
    from napari_attnreg.core.stats.stepdown import significant_steps

    image = make_cell_image([0, 26, 3], size=(320, 300), scale=TRAINING_SCALE, abnormal=True,
                            hard_negatives=False).image
    res = regularize(image, demo, n_boot=30, device="cpu", tiled=True, null_scope=scope)
    md, ns = res.metadata, res.null_summary
    assert md["preset"] == "stepdown" and md["tail"] == "gpd"
    assert md["tile_overlap"] is None and ns["n_families"] == md["n_tiles"] > 1
    tile_tokens = ns["stepdown_step_token"]
    assert tile_tokens.shape == (md["n_tiles"], 16 * 16)
    # every token of the grid belongs to at least one tile, overlap tokens to several
    counts = np.bincount(tile_tokens.ravel(), minlength=res.attention.size)
    assert counts.min() >= 1 and counts.max() > 1
    for alpha in (0.1, 0.5, 1.0):  # the mask is the union of what each selected tile keeps
        steps = significant_steps(ns["stepdown_step_p"], ns["stepdown_adjusted_p"],
                                  ns["stepdown_group_end"], "forwardstop", alpha)
        union = np.zeros(res.attention.size, bool)
        union[tile_tokens[steps]] = True
        np.testing.assert_array_equal(res.significant(q_th=alpha).ravel(), union)
    # the evidence of a token is the best it has in the tiles that hold it
    best = np.ones(res.attention.size)
    family_adjusted = ns["stepdown_family_adjusted_p"][:, None]
    np.minimum.at(best, tile_tokens.ravel(),
                  np.maximum(ns["stepdown_adjusted_p"], family_adjusted).ravel())
    np.testing.assert_allclose(res.posterior.ravel(), 1 - best)


@QUIET
@pytest.mark.parametrize("chunk", [3, 7, 64])
def test_per_tile_nulls_land_in_their_tile_and_row(demo, monkeypatch, chunk):
    """Null job j is null j % B of run tile j // B, whatever the chunks cut through."""
    seen = {}
    real_init = tiled_mod._NullTiles.__init__

    def keep(self, *a, **k):
        real_init(self, *a, **k)
        seen["nulls"] = self

    def draw(self, jobs):  # a null tile whose every pixel is (its job + 1) / 1000
        c = self.tiled.source.shape[0]
        return torch.stack([torch.full((c, *self.tiled.layout.tile), (j + 1) / 1000.0)
                            for j in jobs])

    def score(tiled, backbone, config, run, images, scorer):  # a map that names its job
        n_tok = tiled.layout.tile_grid[0] * tiled.layout.tile_grid[1]
        job = images.reshape(len(images), -1)[:, 0] * 1000.0
        return job[:, None] * 100 + torch.arange(n_tok, dtype=images.dtype) / n_tok

    monkeypatch.setattr(tiled_mod._NullTiles, "__init__", keep)
    monkeypatch.setattr(tiled_mod._NullTiles, "_draw", draw)
    monkeypatch.setattr(tiled_mod, "_forward", score)
    image = make_cell_image(3, size=(300, 260), scale=TRAINING_SCALE).image
    res = regularize(image, demo, n_boot=5, chunk_size=chunk, device="cpu", tiled=True,
                     tile_overlap=0, null_scope="tile")
    nulls = seen["nulls"]
    n_tiles, n_tok = res.metadata["n_tiles"], nulls.tile_tokens
    scores = nulls.scores.numpy().reshape(5, n_tiles, n_tok)
    for tile in range(n_tiles):
        for b in range(5):
            job = tile * 5 + b
            expected = (job + 1) * 100 + np.arange(n_tok) / n_tok
            np.testing.assert_allclose(scores[b, tile], expected, rtol=1e-6,
                                       err_msg=f"tile {tile}, null {b}")
