"""Models with other than three input channels (e.g. 4-channel cell painting ViTs)."""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file

from napari_attnreg.core.models.attention import cls_attention
from napari_attnreg.core.models.backbones import load_backbone


def test_four_channel_weights_file_infers_in_chans(tmp_path):
    torch.manual_seed(0)
    module = timm.create_model("vit_tiny_patch16_224", pretrained=False, in_chans=4,
                               num_classes=0).eval()
    path = tmp_path / "cellpainting_vit.safetensors"
    save_file(module.state_dict(), str(path))
    bb = load_backbone(path, arch="vit_tiny_patch16_224")
    assert bb.in_chans == 4 and bb.input_size == (4, 224, 224)
    assert len(bb.mean) == 4 and len(bb.std) == 4
    x = torch.randn(2, 4, 64, 48)
    with torch.inference_mode():
        maps = cls_attention(bb, x)
        expected = cls_attention(load_backbone(module), x)
    assert maps.shape == (2, 4, 3)
    torch.testing.assert_close(maps, expected)
    with pytest.raises(ValueError, match="4"):
        cls_attention(bb, torch.randn(1, 3, 64, 48))


def test_four_channel_transformers_model():
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(
        "dinov2", hidden_size=32, num_hidden_layers=2, num_attention_heads=4, patch_size=8,
        image_size=32, num_channels=4)
    bb = load_backbone(transformers.AutoModel.from_config(config))
    assert bb.in_chans == 4 and len(bb.mean) == 4 and len(bb.std) == 4
    with torch.inference_mode():
        assert cls_attention(bb, torch.randn(1, 4, 32, 40)).shape == (1, 4, 5)
