"""Shared fixtures: tiny random-init timm ViTs (no downloads) and small images."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import settings

# CI replays the same examples on every run (derandomize), so a submission never fails on a
# new random draw; local runs keep exploring (and keep failures in hypothesis's database).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


def tiny_vit(name: str = "vit_tiny_patch16_224", **kwargs):
    """A random-init timm ViT shrunk to 2 blocks so tests stay fast."""
    import timm

    from napari_attnreg.core.models.backbones import load_backbone

    torch.manual_seed(0)
    module = timm.create_model(name, pretrained=False, depth=kwargs.pop("depth", 2), **kwargs)
    return load_backbone(module)


@pytest.fixture
def fresh_tiny_backbone():
    """A tiny ViT of the test's own (tests that change or share it across threads)."""
    return tiny_vit()


@pytest.fixture(scope="session")
def tiny_backbone():
    return tiny_vit()


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def blob_image(rng):
    """96x80 uint16 image with two bright blobs on noise, like a fluorescence field."""
    yy, xx = np.mgrid[0:96, 0:80]
    img = 400 + 50 * rng.standard_normal((96, 80))
    img += 3000 * np.exp(-((yy - 30) ** 2 + (xx - 20) ** 2) / 60)
    img += 2000 * np.exp(-((yy - 70) ** 2 + (xx - 60) ** 2) / 40)
    return np.clip(img, 0, 65535).astype(np.uint16)
