"""Rotary (timm EVA / DINOv3) fast path against the explicit full attention matrix."""

from __future__ import annotations

import pytest
import timm
import torch
from attention_reference import assert_peaked, max_diff, peaked, timm_explicit

from napari_attnreg.core.models.attention import cls_attention
from napari_attnreg.core.models.backbones import load_backbone

# reduced DINOv3-style (rope 'dinov3', 4 registers, no abs pos) and EVA02-style (rope 'cat',
# abs pos embed, SwiGLU) models: same kwargs as the real ones except width and depth
SMALL = {"depth": 3, "embed_dim": 64, "num_heads": 4}
MODELS = [("vit_small_patch16_dinov3", 5), ("eva02_tiny_patch14_224", 1)]


def _module(name: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return peaked(timm.create_model(name, pretrained=False, **SMALL, **kwargs).eval())


@pytest.mark.parametrize("name,npt", MODELS)
@pytest.mark.parametrize("grid", [(4, 4), (5, 3)])
@pytest.mark.parametrize("layer", [-1, 1])
def test_rotary_fast_path_matches_full_matrix(name, npt, grid, layer):
    # the reference model takes any size; the backbone gets the same weights built for
    # one fixed size, which load_backbone must adapt (rope table and pos embed per grid)
    reference = _module(name, dynamic_img_size=True)
    module = _module(name)
    module.load_state_dict(reference.state_dict())
    bb = load_backbone(module)
    assert bb.adapter.family == "timm-rotary"
    assert bb.num_prefix_tokens == npt
    ph, pw = bb.patch_size
    x = torch.randn(2, 3, ph * grid[0], pw * grid[1])
    with torch.inference_mode():
        fast = cls_attention(bb, x, layer=layer, head="all")
        mean = cls_attention(bb, x, layer=layer, head="mean")
        one = cls_attention(bb, x, layer=layer, head=2)
    slow = timm_explicit(reference, x, layer, npt).reshape(fast.shape)
    assert fast.shape == (2, 4, *grid)
    assert_peaked(slow)
    assert max_diff(fast, slow) <= 1e-5
    assert max_diff(mean, slow.mean(1)) <= 1e-5
    assert max_diff(one, slow[:, 2]) <= 1e-5


def test_rotary_fast_path_builds_no_full_matrix(monkeypatch):
    import napari_attnreg.core.models.timm_attention as ta

    monkeypatch.setattr(ta, "explicit_cls_row", lambda *a: pytest.fail("explicit path used"))
    bb = load_backbone(_module("vit_small_patch16_dinov3"))
    with torch.inference_mode():
        maps = cls_attention(bb, torch.randn(1, 3, 64, 48))
    assert maps.shape == (1, 4, 3)
