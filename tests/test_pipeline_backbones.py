"""The whole pipeline (``regularize``) on each backbone family, not only the timm classic one."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch

from napari_attnreg import regularize
from napari_attnreg.core.models.backbones import load_backbone

FAST = {"n_boot": 6, "seed": 0, "device": "cpu", "target_size": 64}


def _rotary():
    torch.manual_seed(0)
    return timm.create_model("vit_small_patch16_dinov3", pretrained=False, depth=2, embed_dim=64,
                             num_heads=4)


def _transformers():
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(
        "dinov2_with_registers", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        patch_size=8, image_size=64, num_register_tokens=4)
    torch.manual_seed(0)
    return transformers.AutoModel.from_config(config)


@pytest.mark.parametrize("build,family", [(_rotary, "timm-rotary"), (_transformers, "transformers")])
def test_regularize_runs_on_every_family(build, family, blob_image):
    bb = load_backbone(build())
    assert bb.adapter.family == family
    result = regularize(blob_image, bb, **FAST)
    grid = result.attention.shape
    assert result.posterior.shape == grid and np.all(np.isfinite(result.p))
    assert len(grid) == 2 and max(grid) * bb.patch_size[0] == 64  # long side resized to 64 px
    assert result.metadata["num_prefix_tokens"] == 5
