"""``map="attention"`` (default): the CLS attention of one block, head mean or one head."""

from __future__ import annotations

import torch

from napari_attnreg.core.models.attention import cls_attention
from napari_attnreg.core.models.base import Backbone
from napari_attnreg.core.models.scorers.base import Needs, Scorer


class AttentionScorer(Scorer):
    """The paper's map: softmax of the CLS query over every token, patch columns kept."""

    name = "attention"
    label = "attention"
    needs = Needs(cls_heads=True)

    def scores(self, backbone: Backbone, batch: torch.Tensor) -> torch.Tensor:
        maps = cls_attention(backbone, batch, layer=self.layer, head=self.head)
        return maps.reshape(maps.shape[0], -1)

    @property
    def cls_head(self) -> str | int:
        return self.head

    def from_heads(self, heads: torch.Tensor) -> torch.Tensor:
        return heads.mean(dim=1) if self.head == "mean" else heads[:, int(self.head)]
