"""The bundled demo model: loads offline and its attention lands on the planted objects."""

from __future__ import annotations

import numpy as np
import torch

from napari_attnreg import regularize
from napari_attnreg.core.models.attention import cls_attention
from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.run.images import prepare_image
from napari_attnreg.samples import demo_image, demo_mask
from napari_attnreg.testing.synthetic import TRAINING_SCALE, make_cell_image


def test_demo_model_loads_offline():
    bb = load_backbone("demo")
    assert bb.name == "demo" and not bb.is_random_init
    assert bb.patch_size == (8, 8) and bb.num_prefix_tokens == 1
    assert bb.extra["classes"] == ["normal", "mitotic"]


def test_attention_mass_concentrates_on_decisive_objects():
    bb = load_backbone("demo")
    ratios = []
    for i in range(6):
        s = make_cell_image([123, 9, i], size=512, scale=4 * TRAINING_SCALE, abnormal=True,
                            hard_negatives=False)
        prep = prepare_image(s.image, patch_size=bb.patch_size, mean=bb.mean, std=bb.std,
                             default_size=bb.input_size[1:])
        with torch.inference_mode():
            att = cls_attention(bb, prep.tensor[None])[0].numpy()
        g = att.shape[0]
        cover = s.decisive_mask.reshape(g, 512 // g, g, 512 // g).mean(axis=(1, 3)) >= 0.25
        ratios.append((att[cover].sum() / att.sum()) / cover.mean())
    assert np.median(ratios) > 3.0, ratios


def test_significant_tokens_overlap_the_mask_far_better_than_chance():
    # uncorrected p ≤ 0.05 is a rule of the pooled-null presets (the step-down refuses it)
    res = regularize(demo_image(), "demo", n_boot=40, seed=0, device="cpu",
                     preset="directional")
    truth = res.token_coverage(demo_mask()) >= 0.25
    sig = res.significant("p", p_th=0.05)
    assert sig.any()
    precision = (sig & truth).sum() / sig.sum()
    assert precision > 4 * truth.mean(), (precision, truth.mean())
