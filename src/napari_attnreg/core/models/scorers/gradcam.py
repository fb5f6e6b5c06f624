"""``map="gradcam"``: Grad-CAM on the last block's ``norm1`` output, the raw map.

The ViT recipe of the ``grad-cam`` package: the patch tokens of that output reshaped to the
grid are the "channels", ``w_d`` is the gradient's mean over the patch tokens, the map is
``ReLU(Σ_d w_d·x_{t,d})``. Never min–max rescaled: a per-image rescale would erase the
concentration the statistics test.
"""

from __future__ import annotations

import torch

from napari_attnreg.core.models.base import Backbone
from napari_attnreg.core.models.scorers.base import Needs, Scorer
from napari_attnreg.core.models.scorers.parts import norm1_and_gradient


class GradCamScorer(Scorer):
    """``ReLU(Σ_d mean_t(∂score/∂x_{t,d}) · x_{t,d})`` over the patch tokens."""

    name = "gradcam"
    label = "Grad-CAM"
    needs = Needs(gradients=True, target=True, shares=False)

    def scores(self, backbone: Backbone, batch: torch.Tensor) -> torch.Tensor:
        x, grad = norm1_and_gradient(backbone, batch, self.target)
        npt = backbone.num_prefix_tokens
        x, grad = x[:, npt:].float(), grad[:, npt:].float()
        weights = grad.mean(dim=1, keepdim=True)
        return (weights * x).sum(dim=-1).clamp_min(0.0)
