"""Maps (scorers) against independent slow versions, targets, concepts and the map checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attention_reference import peaked

from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.models.scorers import SCORERS, make_scorer, map_names
from napari_attnreg.core.models.scorers.target import final_cls
from napari_attnreg.core.run.concept import concept_from
from napari_attnreg.core.stats.map_checks import (
    SANITY_RHO,
    attention_sinks,
    earlier_block,
    redraw_last_block,
    sanity_check,
    sink_tokens,
)
from napari_attnreg.core.stats.stepdown import step_down
from napari_attnreg.core.stats.stepdown_maps import stepdown_statistics

transformers = pytest.importorskip("transformers")


def tiny_vit(name: str, **kwargs):
    """A random-init timm ViT of 2 blocks unless told (as conftest's, built here so the
    module does not import a conftest by name)."""
    import timm

    from napari_attnreg.core.models.backbones import load_backbone

    torch.manual_seed(0)
    return load_backbone(timm.create_model(name, pretrained=False,
                                           depth=kwargs.pop("depth", 2), **kwargs))


def peaked_timm(**kwargs):
    """A tiny timm classifier with unit-scale weights (maps far from uniform), 3 blocks."""
    bb = tiny_vit("vit_tiny_patch16_224", depth=3, img_size=64, num_classes=5, **kwargs)
    peaked(bb.model)
    return bb


def tiny_dinov2():
    config = transformers.AutoConfig.for_model(
        "dinov2", hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=64, patch_size=14, image_size=56)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()
    return load_backbone(peaked(model))


@pytest.fixture(scope="module")
def timm_bb():
    return peaked_timm()


@pytest.fixture(scope="module")
def hf_bb():
    return tiny_dinov2()


def images(bb, n=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ph, pw = bb.patch_size
    return torch.randn(n, 3, 4 * ph, 4 * pw, generator=gen)


# ------------------------------------------------------------------ rollout
def full_attention_timm(model, x):
    """Every block's full (N, heads, L, L) attention, captured with the fused kernel off."""
    found = []
    handles = [b.attn.attn_drop.register_forward_hook(lambda m, i, o: found.append(o.double()))
               for b in model.blocks]
    for b in model.blocks:
        b.attn.fused_attn = False
    try:
        with torch.no_grad():
            model.forward_features(x)
    finally:
        for h in handles:
            h.remove()
        for b in model.blocks:
            b.attn.fused_attn = True
    return found


def full_attention_hf(model, x):
    with torch.no_grad():
        return [a.double() for a in model(pixel_values=x, output_attentions=True).attentions]


def rollout_by_products(per_layer, npt):
    """Abnar & Zuidema written out: per layer ½Ā + ½I, rows normalised, matrices multiplied."""
    n, length = per_layer[0].shape[0], per_layer[0].shape[-1]
    out = np.zeros((n, length - npt))
    for i in range(n):
        rolled = np.eye(length)
        for full in per_layer:
            mean = full[i].mean(0).numpy()
            factor = 0.5 * mean + 0.5 * np.eye(length)
            factor = factor / factor.sum(axis=1, keepdims=True)
            rolled = factor @ rolled
        out[i] = rolled[0, npt:]
    return out


def rotary_dinov3():
    """A reduced timm DINOv3 (rotary attention, 4 registers): rollout's captured-matrix path."""
    import timm

    torch.manual_seed(0)
    return load_backbone(peaked(timm.create_model(
        "vit_small_patch16_dinov3", pretrained=False, depth=3, embed_dim=64, num_heads=4,
        img_size=64).eval()))


@pytest.mark.parametrize("family", ["timm", "hf", "rotary"])
def test_rollout_matches_explicit_matrix_products(family, timm_bb, hf_bb):
    bb = {"timm": timm_bb, "hf": hf_bb}.get(family) or rotary_dinov3()
    x = images(bb)
    full = (full_attention_hf(bb.model, x) if family == "hf"
            else full_attention_timm(bb.model, x))
    slow = rollout_by_products(full, bb.num_prefix_tokens)
    with torch.inference_mode():
        fast = make_scorer("rollout").score(bb, x).double().numpy()
    assert fast.shape == slow.shape
    assert np.ptp(slow) > 1e-3 / slow.shape[1], "rollout nearly uniform: the test would be blind"
    np.testing.assert_allclose(fast, slow, rtol=2e-4, atol=1e-7)


# ------------------------------------------------------------------ CDAM
def cdam_per_token_loop(bb, image, score_of):
    """CDAM as the reference computes it, on one image: hooks on the last block's norm1,
    ``backward()``, then a Python loop of per-token dot products."""
    blocks = bb.model.blocks if hasattr(bb.model, "blocks") else bb.model.encoder.layer
    norm = blocks[-1].norm1
    seen = {}
    h1 = norm.register_forward_hook(lambda m, i, o: seen.__setitem__("act", o.detach()))
    h2 = norm.register_full_backward_hook(lambda m, gi, go: seen.__setitem__("grad", go[0]))
    x = image[None].clone().requires_grad_(True)
    try:
        score_of(x).backward()
    finally:
        h1.remove()
        h2.remove()
    npt = bb.num_prefix_tokens
    tokens, grads = seen["act"][0, npt:], seen["grad"][0, npt:]
    return torch.tensor([float(torch.dot(tokens[i], grads[i])) for i in range(len(tokens))])


def test_cdam_class_matches_per_token_loop(timm_bb):
    x = images(timm_bb)
    scorer = make_scorer("cdam", target=3)
    with torch.inference_mode():  # as the engines call it
        fast = scorer.score(timm_bb, x)
    for i in range(2):
        slow = cdam_per_token_loop(timm_bb, x[i], lambda im: timm_bb.model(im)[0, 3])
        assert float(slow.abs().max()) > 0
        torch.testing.assert_close(fast[i], slow, rtol=1e-4, atol=1e-6)
    assert float(fast.min()) < 0 < float(fast.max()), "CDAM is signed"


def test_cdam_concept_on_dinov2_matches_per_token_loop(hf_bb):
    x = images(hf_bb)
    concept = torch.randn(hf_bb.embed_dim, generator=torch.Generator().manual_seed(1))
    fast = make_scorer("cdam", target=concept.numpy()).score(hf_bb, x)

    def cosine(im):
        cls = hf_bb.model(pixel_values=im).last_hidden_state[0, 0]
        return torch.nn.functional.cosine_similarity(cls, concept, dim=0)

    for i in range(2):
        slow = cdam_per_token_loop(hf_bb, x[i], cosine)
        assert float(slow.abs().max()) > 0
        torch.testing.assert_close(fast[i], slow, rtol=1e-4, atol=1e-7)


def test_predicted_target_is_the_observed_class_for_every_null(timm_bb):
    x = images(timm_bb, n=3)
    bound = make_scorer("cdam").bind(timm_bb, x[:1])
    with torch.no_grad():
        top = int(timm_bb.model(x[:1]).argmax())
    assert bound.target.kind == "class" and bound.target.index == top
    explicit = make_scorer("cdam", target=top).score(timm_bb, x)
    torch.testing.assert_close(bound.score(timm_bb, x), explicit)


# ------------------------------------------------------------------ Grad-CAM
def test_gradcam_matches_grad_cam_package_unscaled(timm_bb, monkeypatch):
    base_cam = pytest.importorskip("pytorch_grad_cam.base_cam",
                                   reason="the grad-cam package is not installed "
                                          "(pip install grad-cam)")
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    # the package rescales every map to [0, 1] and resizes it: keep its raw map instead
    monkeypatch.setattr(base_cam, "scale_cam_image", lambda cam, target_size=None: cam)
    model, npt = timm_bb.model, timm_bb.num_prefix_tokens
    x = images(timm_bb)
    grid = (x.shape[-2] // 16, x.shape[-1] // 16)

    def to_grid(tokens):  # the package's ViT recipe: drop the CLS token, tokens as channels
        return tokens[:, npt:].reshape(tokens.shape[0], *grid, -1).permute(0, 3, 1, 2)

    cam = GradCAM(model=model, target_layers=[model.blocks[-1].norm1], reshape_transform=to_grid)
    package = cam(input_tensor=x, targets=[ClassifierOutputTarget(2)] * 2)
    ours = make_scorer("gradcam", target=2).score(timm_bb, x).reshape(2, *grid).numpy()
    assert package.max() > 0 and (package == 0).any(), "the test needs a map with ReLU zeros"
    np.testing.assert_allclose(ours, package, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ heads and attention
def test_heads_and_attention_agree_with_each_other(timm_bb):
    x = images(timm_bb)
    heads = make_scorer("heads").score(timm_bb, x)
    assert heads.shape == (2, timm_bb.num_heads, 16)
    torch.testing.assert_close(make_scorer("attention").score(timm_bb, x), heads.mean(1))
    torch.testing.assert_close(make_scorer("attention", head=1).score(timm_bb, x), heads[:, 1])


def test_each_head_alone_equals_the_head_family_before_bh(timm_bb):
    x = images(timm_bb, n=41)
    heads = make_scorer("heads").score(timm_bb, x)  # image 0 observed, 40 nulls
    obs, null = heads[0], heads[1:]
    n_heads, tokens = obs.shape
    stats = stepdown_statistics(
        obs.mean(0), null.reshape(40, -1), families=obs,
        owner=(np.repeat(np.arange(n_heads), tokens), np.tile(np.arange(tokens), n_heads)),
        family_tokens=np.tile(np.arange(tokens), (n_heads, 1)))
    family_p = stats.null_summary["stepdown_family_p"]
    for h in range(n_heads):
        alone = step_down(obs[h][None], null[:, h])
        assert family_p[h] == alone.family_p[0]
        np.testing.assert_array_equal(stats.null_summary["stepdown_step_p"][h], alone.step_p[0])


# ------------------------------------------------------------------ targets
def test_class_map_without_head_or_concept_names_both_ways_out(hf_bb):
    for name in ("cdam", "gradcam"):
        with pytest.raises(ValueError, match=r'--concept FILE.*Concept from ROI.*target=<concept>.*map="attention"'):
            make_scorer(name).check(hf_bb)
    with pytest.raises(ValueError, match="width 32"):
        make_scorer("cdam", target=np.ones(7)).check(hf_bb)
    make_scorer("cdam", target=np.ones(32)).check(hf_bb)
    make_scorer("attention").check(hf_bb)  # no target needed


def test_class_index_out_of_range_and_unknown_map_are_refused(timm_bb):
    with pytest.raises(ValueError, match="5 classes"):
        make_scorer("gradcam", target=5).check(timm_bb)
    with pytest.raises(ValueError, match="'attention', 'heads', 'rollout', 'cdam', 'gradcam'"):
        make_scorer("saliency")
    with pytest.raises(ValueError, match="concept"):
        make_scorer("cdam", target="dog")


def test_registry_declares_what_each_map_needs():
    assert map_names()[0] == "attention"
    assert SCORERS["cdam"].needs.signed and SCORERS["cdam"].needs.gradients
    assert not SCORERS["gradcam"].needs.signed and SCORERS["gradcam"].needs.target
    assert SCORERS["rollout"].needs.all_layers and SCORERS["heads"].needs.family == "heads"
    assert not SCORERS["attention"].needs.target


# ------------------------------------------------------------------ concepts
def test_concept_from_examples_is_their_mean_final_cls(hf_bb, rng):
    examples = [rng.random((56, 56)).astype(np.float32) for _ in range(3)]
    concept = concept_from(examples, hf_bb)
    from napari_attnreg.core.run.images import prepare_image

    tokens = []
    for ex in examples:
        prepared = prepare_image(ex, patch_size=hf_bb.patch_size, mean=hf_bb.mean,
                                 std=hf_bb.std, default_size=hf_bb.input_size[1:])
        with torch.no_grad():
            tokens.append(hf_bb.model(pixel_values=prepared.tensor[None])
                          .last_hidden_state[0, 0].numpy())
    np.testing.assert_allclose(concept, np.mean(tokens, axis=0), rtol=1e-5, atol=1e-6)
    assert concept.shape == (32,) and concept.dtype == np.float32


def test_concept_from_mask_uses_a_crop_around_each_region(timm_bb, rng):
    image = rng.random((120, 100)).astype(np.float32)
    mask = np.zeros((120, 100), dtype=bool)
    mask[10:30, 10:30] = True
    mask[70:100, 50:90] = True
    # each box grown by a quarter of its side, and to at least 32 px
    crops = [image[4:36, 4:36], image[62:108, 40:100]]
    np.testing.assert_allclose(concept_from(image, timm_bb, mask=mask),
                               concept_from(crops, timm_bb), rtol=1e-6)
    with pytest.raises(ValueError, match="no regions"):
        concept_from(image, timm_bb, mask=np.zeros_like(mask))
    with pytest.raises(ValueError, match="draw the mask on this image"):
        concept_from(image, timm_bb, mask=mask[:50])


def test_final_cls_is_the_final_norm_cls_token(timm_bb):
    x = images(timm_bb)
    with torch.no_grad():
        torch.testing.assert_close(final_cls(timm_bb, x), timm_bb.model.forward_features(x)[:, 0])


# ------------------------------------------------------------------ sanity check
@pytest.mark.parametrize("family", ["timm", "hf"])
def test_redrawn_last_block_changes_only_that_block(family, timm_bb, hf_bb):
    bb = timm_bb if family == "timm" else hf_bb
    before = {k: v.clone() for k, v in bb.model.state_dict().items()}
    copy = redraw_last_block(bb, seed=3)
    again = redraw_last_block(bb, seed=3)
    last = f"blocks.{bb.depth - 1}." if family == "timm" else f"encoder.layer.{bb.depth - 1}."
    for key, value in copy.model.state_dict().items():
        torch.testing.assert_close(bb.model.state_dict()[key], before[key])  # original kept
        if key.startswith(last) and key.endswith("weight") and value.ndim == 2:
            assert not torch.equal(value, before[key]), key
            torch.testing.assert_close(value, again.model.state_dict()[key])  # seeded
        elif not key.startswith(last):  # shared with the model, never copied
            assert value.data_ptr() == bb.model.state_dict()[key].data_ptr(), key


def test_sanity_check_warns_when_the_map_ignores_the_last_block(timm_bb):
    image = images(timm_bb, n=1)[0]
    first_block = sanity_check(make_scorer("attention", layer=0), timm_bb, image, seed=0)
    assert first_block.rho == pytest.approx(1.0) and first_block.failed
    assert "barely depends" in first_block.diagnostic("attention").message
    # a map of an earlier block is out of the check's reach, and the warning says so (it
    # read as doubt on every --layer -2 map)
    where = earlier_block(make_scorer("attention", layer=0), timm_bb)
    assert where == (0, timm_bb.depth)
    said = first_block.diagnostic("attention", where).message
    assert "barely depends" in said and f"block 1 of {timm_bb.depth}" in said
    assert "cannot judge this map" in said
    for reads_last in (make_scorer("attention"), make_scorer("attention", layer=timm_bb.depth - 1),
                       make_scorer("rollout"), make_scorer("cdam", target=1)):
        assert earlier_block(reads_last, timm_bb) is None, reads_last.name
    last = sanity_check(make_scorer("cdam", target=1), timm_bb, image, seed=0)
    assert last.rho < SANITY_RHO and last.diagnostic("cdam") is None


# ------------------------------------------------------------------ attention sinks
def with_sink(bb, token: int, boost: float = 40.0):
    """A copy of ``bb`` whose patch ``token`` is high-norm and takes the CLS attention."""
    from napari_attnreg.core.models.base import copy_module

    model = copy_module(bb.model, lambda t: t.clone())
    npt = bb.num_prefix_tokens
    with torch.no_grad():
        model.pos_embed[0, npt + token] += boost * torch.randn(model.embed_dim,
                                                               generator=torch.Generator()
                                                               .manual_seed(5))
        seen = {}
        block = model.blocks[-1]
        h = block.norm1.register_forward_hook(lambda m, i, o: seen.__setitem__("h", o))
        model.forward_features(images(bb, n=1))
        h.remove()
        w = seen["h"][0, npt + token]  # what the sink looks like to the last block
        width = model.embed_dim
        u = torch.ones(width) / width ** 0.5
        qkv = block.attn.qkv
        qkv.weight[:width] = 0
        qkv.bias[:width] = 30 * u  # every head's CLS query points along u ...
        qkv.weight[width:2 * width] = torch.outer(u, w / w.norm() ** 2)  # ... keys: u·(w·h)
        qkv.bias[width:2 * width] = 0
    from dataclasses import replace

    return replace(bb, model=model)


def test_attention_sink_is_named_and_plain_tokens_are_not(timm_bb):
    image = images(timm_bb, n=1)[0]
    plain = attention_sinks(timm_bb, image)
    assert plain.tokens == () and plain.diagnostic() is None
    report = attention_sinks(with_sink(timm_bb, token=6), image)
    assert report.tokens == (6,)
    assert report.norm_ratio[6] > 3 and report.share[6] > 2 / 16
    message = report.diagnostic().message
    assert "row 1, column 2" in message and "attention sink, not image content" in message


def test_sink_rule_needs_both_a_high_norm_and_a_large_share():
    ratio = np.array([1.0, 5.0, 5.0, 1.0])
    share = np.array([0.1, 0.1, 0.6, 0.2])
    assert sink_tokens(ratio, share) == (2,)


def test_gradient_maps_bypass_the_autocast_weight_cache(monkeypatch):
    # a GPU bf16 run failed: the forward passes cache bf16 weight copies inside inference
    # mode, and the gradient map's backward pass then met those inference tensors
    from napari_attnreg.core.models.scorers import make_scorer, parts

    backbone = tiny_vit("vit_tiny_patch16_224")
    seen = []
    real = parts.target_score
    monkeypatch.setattr(parts, "target_score", lambda *a: seen.append(
        (torch.is_autocast_enabled("cpu"), torch.is_autocast_cache_enabled())) or real(*a))
    batch = torch.randn(2, 3, 224, 224)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        scores = make_scorer("gradcam", target=3).score(backbone, batch)
    assert scores.shape == (2, 196) and seen == [(True, False)]


def test_the_redrawn_block_holds_ordinary_tensors_inside_inference_mode(monkeypatch):
    # on an H100 the sanity check of CDAM and Grad-CAM failed: the re-drawn block, made inside
    # the engine's inference mode, held inference tensors that a backward pass cannot save
    from torch import nn

    from napari_attnreg.core.stats.map_checks import redraw_last_block

    backbone = tiny_vit("vit_tiny_patch16_224")
    modes = []
    real_to = nn.Module.to
    # on a CPU the move is a no-op: record the mode the block is moved to its device in
    monkeypatch.setattr(nn.Module, "to", lambda self, *a, **k: modes.append(
        torch.is_inference_mode_enabled()) or real_to(self, *a, **k))
    with torch.inference_mode():
        redrawn = redraw_last_block(backbone, seed=0)
    monkeypatch.undo()
    assert modes and not any(modes)
    assert not any(p.is_inference() for p in redrawn.model.parameters())
    with torch.inference_mode():
        scores = make_scorer("cdam", target=3).score(redrawn, torch.randn(1, 3, 224, 224))
    assert scores.shape == (1, 196)


def test_what_the_initialisation_leaves_alone_keeps_the_trained_values(timm_bb):
    # the re-drawn block starts as NaN, not as a copy read back from the device: a layer
    # scale (no reset in timm) and a non-persistent buffer must still hold the trained values
    from torch import nn

    from napari_attnreg.core.stats.map_checks import redraw_last_block

    block = timm_bb.model.blocks[-1]
    block.kept_scale = nn.Parameter(torch.full((block.norm1.normalized_shape[0],), 0.37))
    block.register_buffer("cache", torch.arange(5.0), persistent=False)
    block.register_buffer("index", torch.arange(7))
    try:
        fresh = redraw_last_block(timm_bb, seed=1).model.blocks[-1]
        assert torch.equal(fresh.kept_scale, block.kept_scale)
        assert torch.equal(fresh.cache, block.cache) and torch.equal(fresh.index, block.index)
        assert not any(torch.isnan(t).any() for t in fresh.state_dict().values())
        assert not torch.equal(fresh.attn.qkv.weight, block.attn.qkv.weight)
    finally:
        del block.kept_scale, block.cache, block.index


def test_the_draw_is_made_once_per_block_and_seed_and_never_holds_trained_values(monkeypatch):
    # a folder run with one model re-draws the last block once, not once per image (a ViT-B
    # draw costs more host time than the checks' passes); the trained values are read anew
    import gc

    from napari_attnreg.core.stats import map_checks

    backbone = tiny_vit("vit_tiny_patch16_224")
    block = backbone.model.blocks[-1]
    block.register_buffer("kept", torch.full((3,), 0.5))  # not drawn: the trained value stays
    draws = []
    real_init = map_checks._init_module
    monkeypatch.setattr(map_checks, "_init_module",
                        lambda model, module: draws.append(module) or real_init(model, module))
    first = redraw_last_block(backbone, seed=2).model.blocks[-1]
    n_draw = len(draws)
    assert n_draw > 0
    again = redraw_last_block(backbone, seed=2).model.blocks[-1]
    assert len(draws) == n_draw  # kept, not drawn again
    for (name, a), b in zip(first.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    with torch.no_grad():
        block.kept.fill_(0.25)  # a changed trained value is taken at the next use
    assert torch.equal(redraw_last_block(backbone, seed=2).model.blocks[-1].kept,
                       torch.full((3,), 0.25))
    assert torch.equal(first.kept, torch.full((3,), 0.5))  # an earlier copy is left as it was
    other = redraw_last_block(backbone, seed=3).model.blocks[-1]
    assert len(draws) == 2 * n_draw  # another seed is another draw
    assert not torch.equal(other.attn.qkv.weight, first.attn.qkv.weight)

    del block, first, again, other, backbone
    gc.collect()
    assert not [m for m in map_checks._DRAWN.keys() if hasattr(m, "kept")]  # weak keys


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on a lent GPU)")
def test_on_a_gpu_the_redraw_is_the_cpu_redraw_and_never_waits_for_the_device(timm_bb):
    from napari_attnreg.core.stats.map_checks import redraw_last_block

    gpu = timm_bb.on("cuda")
    torch.cuda.set_sync_debug_mode("error")  # a blocking copy or a read-back raises
    try:
        redrawn = redraw_last_block(gpu, seed=4)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    on_cpu = redraw_last_block(timm_bb, seed=4).model.state_dict()
    for name, value in redrawn.model.state_dict().items():
        torch.testing.assert_close(value.cpu(), on_cpu[name], rtol=0, atol=0, msg=name)
