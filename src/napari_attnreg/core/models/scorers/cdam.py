"""``map="cdam"``: class-discriminative attention (Brocki & Chung 2023), signed.

Per patch token, the dot product of the last block's ``norm1`` output with the gradient of
the target score (class logit or concept similarity) with respect to it — the seed paper's
reference map. Positive: the token speaks for the target; negative: against it.
"""

from __future__ import annotations

import torch

from napari_attnreg.core.models.base import Backbone
from napari_attnreg.core.models.scorers.base import Needs, Scorer
from napari_attnreg.core.models.scorers.parts import norm1_and_gradient


class CdamScorer(Scorer):
    """``Σ_d x_{t,d} · ∂score/∂x_{t,d}`` on the patch tokens of the last block's input norm."""

    name = "cdam"
    label = "CDAM"
    needs = Needs(gradients=True, target=True, signed=True, shares=False)

    def scores(self, backbone: Backbone, batch: torch.Tensor) -> torch.Tensor:
        x, grad = norm1_and_gradient(backbone, batch, self.target)
        npt = backbone.num_prefix_tokens
        return (x[:, npt:].float() * grad[:, npt:].float()).sum(dim=-1)
