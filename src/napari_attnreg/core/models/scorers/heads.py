"""``map="heads"``: every head's CLS attention; each head is a family of its own."""

from __future__ import annotations

import torch

from napari_attnreg.core.models.attention import cls_attention
from napari_attnreg.core.models.base import Backbone
from napari_attnreg.core.models.scorers.base import Needs, Scorer


class HeadsScorer(Scorer):
    """``(N, H, T)``: the attention of each head of ``layer``, tested head by head."""

    name = "heads"
    label = "per-head attention"
    needs = Needs(family="heads", cls_heads=True)

    def scores(self, backbone: Backbone, batch: torch.Tensor) -> torch.Tensor:
        maps = cls_attention(backbone, batch, layer=self.layer, head="all")
        return maps.reshape(maps.shape[0], maps.shape[1], -1)

    cls_head = "all"

    def from_heads(self, heads: torch.Tensor) -> torch.Tensor:
        return heads
