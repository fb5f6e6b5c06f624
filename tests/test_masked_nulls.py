"""The whole-image nulls of a tiled run with a tissue mask (``normal``, ``uniform``,
``pixel``: the directional and paper presets' defaults) take their statistics from the
tissue: on a slide of 70 % glass the glass's brightness set their mean and spread, and the
tissue's tiles were tested against glass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_attnreg.core.run import tiling
from napari_attnreg.core.run.nulls import NullConfig
from napari_attnreg.core.run.tiling import ImageNull

GLASS = 0.92


def _slide() -> tuple[torch.Tensor, np.ndarray]:
    """(1, 256, 256): tissue (noise around 0.3) in the top-left 40 %, glass elsewhere."""
    rng = np.random.default_rng(0)
    image = np.full((1, 256, 256), GLASS, np.float32)
    tissue = np.zeros((256, 256), bool)
    tissue[:160, :160] = True
    image[0][tissue] = (0.3 + 0.1 * rng.standard_normal(tissue.sum())).clip(0, 1)
    return torch.from_numpy(image), tissue


@pytest.mark.parametrize("method", ["normal", "uniform", "pixel"])
def test_the_null_is_drawn_from_the_tissue_not_the_glass(method):
    image, tissue = _slide()
    values = image[0].numpy()[tissue]
    mask = tissue[::4, ::4]  # a thumbnail's resolution: placed by proportion
    null = ImageNull(image, NullConfig(method=method), (64, 64), 8, tissue=mask)
    draws = null.draw(range(8), seed=0).numpy()
    if method == "normal":
        assert float(null.mean) == pytest.approx(values.mean(), abs=1e-4)
        assert float(null.std) == pytest.approx(values.std(), abs=1e-4)
    elif method == "uniform":
        assert float(null.low) == pytest.approx(values.min())
        assert float(null.low + null.span) == pytest.approx(values.max())
    else:
        assert not np.isin(draws, [GLASS]).any()  # every pixel vector is the tissue's
    assert abs(draws.mean() - values.mean()) < 0.05
    # without the mask the glass pulls the null up: what a masked run used to test against
    whole = ImageNull(image, NullConfig(method=method), (64, 64), 8).draw(range(8), seed=0)
    assert float(whole.mean()) > values.mean() + 0.15


def test_a_masked_tiled_run_hands_its_mask_to_the_image_null(monkeypatch):
    from napari_attnreg import regularize

    image, tissue = _slide()
    made = []

    class Recording(ImageNull):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr("napari_attnreg.core.run.tiled_engine.ImageNull", Recording)
    regularize(image[0].numpy(), "demo", tiled=True, tissue_mask=tissue, preset="directional",
               n_boot=4, device="cpu")
    [null] = made
    assert null.config.method == "normal"
    assert float(null.mean) < 0.5  # the tissue's (0.3 in the image's own scaling), not glass
    assert tiling.TISSUE_SAMPLE_PIXELS >= 1 << 20
