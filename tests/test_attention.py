"""The CLS-row fast path against the full attention matrix computed the slow explicit way."""

from __future__ import annotations

import pytest
import timm
import torch
from attention_reference import assert_peaked, peaked, timm_explicit

from napari_attnreg.core.models.attention import cls_attention
from napari_attnreg.core.models.backbones import load_backbone

# (architecture, expected prefix tokens): DINO-style ViT-S/8, DeiT distilled, DINOv2 + 4 registers
MODELS = [
    ("vit_small_patch8_224", 1),
    ("deit_small_distilled_patch16_224", 2),
    ("vit_small_patch14_reg4_dinov2", 5),
]


@pytest.mark.parametrize("name,npt", MODELS)
@pytest.mark.parametrize("layer", [-1, 1])
def test_fast_path_matches_full_matrix(name, npt, layer):
    torch.manual_seed(0)
    module = peaked(timm.create_model(name, pretrained=False, depth=3))
    bb = load_backbone(module)
    assert bb.num_prefix_tokens == npt
    ph, pw = bb.patch_size
    x = torch.randn(2, 3, ph * 7, pw * 5)  # non-square, non-default size: pos-embed resampling
    with torch.inference_mode():
        fast = cls_attention(bb, x, layer=layer, head="all")
    slow = timm_explicit(bb.model, x, layer, npt).reshape(fast.shape)  # the copy takes any size
    assert fast.dtype == torch.float32
    assert fast.shape == (2, module.blocks[0].attn.num_heads, 7, 5)
    assert_peaked(slow)
    assert (fast - slow).abs().max().item() <= 1e-5
    # softmax ran over all tokens, prefix included: patch entries sum to less than one
    assert torch.all(fast.sum((-1, -2)) < 1.0)


def test_head_options(tiny_backbone):
    x = torch.randn(1, 3, 64, 48)
    with torch.inference_mode():
        every = cls_attention(tiny_backbone, x, head="all")
        mean = cls_attention(tiny_backbone, x, head="mean")
        one = cls_attention(tiny_backbone, x, head=1)
    torch.testing.assert_close(mean, every.mean(1))
    torch.testing.assert_close(one, every[:, 1])
    with pytest.raises(ValueError, match="head"):
        cls_attention(tiny_backbone, x, head=99)
    with pytest.raises(ValueError, match="layer"):
        cls_attention(tiny_backbone, x, layer=7)
    with pytest.raises(ValueError, match="multiple of the patch"):
        cls_attention(tiny_backbone, torch.randn(1, 3, 60, 48))


def test_fast_path_is_used_and_never_builds_the_matrix(tiny_backbone, monkeypatch):
    """The explicit fallback must not run for plain timm ViTs."""
    import napari_attnreg.core.models.timm_attention as ta

    def boom(*a, **k):
        raise AssertionError("explicit path used")

    monkeypatch.setattr(ta, "explicit_cls_row", boom)
    with torch.inference_mode():
        cls_attention(tiny_backbone, torch.randn(1, 3, 32, 32))


def test_explicit_fallback_matches_fast_path(monkeypatch):
    """A timm attention module without a fast path is captured whole, with the same result."""
    import napari_attnreg.core.models.timm_attention as ta

    torch.manual_seed(0)
    module = timm.create_model("eva02_tiny_patch14_224", pretrained=False, depth=2)
    bb = load_backbone(module)
    x = torch.randn(1, 3, 14 * 6, 14 * 4)
    with torch.inference_mode():
        fast = cls_attention(bb, x, head="all")
        monkeypatch.setattr(ta, "rotary_fast_path", lambda *a: False)
        slow = cls_attention(bb, x, head="all")
    assert slow.shape == (1, 3, 6, 4)
    assert (fast - slow).abs().max().item() <= 1e-5
    assert torch.all(slow >= 0) and torch.all(slow.sum((-1, -2)) <= 1.0 + 1e-6)
