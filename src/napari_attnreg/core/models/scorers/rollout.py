"""``map="rollout"``: attention rollout (Abnar & Zuidema 2020) through every block.

``R = Π_l (½·Ā_l + ½·I)``, each factor's rows re-normalised, ``Ā_l`` the head-mean attention
of block ``l``; the map is ``R``'s CLS row over the patch tokens. ``R`` is carried forward
one block at a time (``R ← Ã_l · R``), so only one ``L×L`` product per image is held.
"""

from __future__ import annotations

import torch

from napari_attnreg.core.models.base import Backbone
from napari_attnreg.core.models.scorers.base import Needs, Scorer
from napari_attnreg.core.models.scorers.parts import each_block_attention


def residual_factor(mean_attention: torch.Tensor) -> torch.Tensor:
    """``½·Ā + ½·I`` with its rows re-normalised to sum to 1."""
    eye = torch.eye(mean_attention.shape[-1], device=mean_attention.device,
                    dtype=mean_attention.dtype)
    factor = 0.5 * mean_attention + 0.5 * eye
    return factor / factor.sum(dim=-1, keepdim=True)


class RolloutScorer(Scorer):
    """The CLS row of the rolled-out attention of all blocks."""

    name = "rollout"
    label = "attention rollout"
    needs = Needs(all_layers=True)

    def scores(self, backbone: Backbone, batch: torch.Tensor) -> torch.Tensor:
        state: dict[str, torch.Tensor] = {}

        def accumulate(_index: int, mean_attention: torch.Tensor) -> None:
            # float32 even under bf16 autocast, as the attention itself
            with torch.autocast(device_type=batch.device.type, enabled=False):
                factor = residual_factor(mean_attention.float())
                state["R"] = factor if "R" not in state else factor @ state["R"]

        each_block_attention(backbone, batch, accumulate)
        return state["R"][:, 0, backbone.num_prefix_tokens:]
