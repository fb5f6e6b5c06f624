"""CLS→patch attention of one transformer block, computed from the CLS query row only.

Every backbone family (timm classic, timm rotary, transformers) has an adapter whose
``cls_row`` runs the blocks before the chosen one as the library wrote them and then forms
only the CLS query's attention row in float32: no T×T matrix, later blocks skipped.
"""

from __future__ import annotations

from typing import Literal

import torch

from napari_attnreg.core.models.base import Backbone

HeadChoice = Literal["mean", "all"] | int


def _resolve_layer(depth: int, layer: int) -> int:
    idx = layer if layer >= 0 else depth + layer
    if not 0 <= idx < depth:
        raise ValueError(f"layer={layer} is out of range for a model with {depth} blocks "
                         f"(use -1 for the last block, or 0..{depth - 1}).")
    return idx


def cls_attention(
    backbone: Backbone,
    images: torch.Tensor,
    *,
    layer: int = -1,
    head: HeadChoice = "mean",
) -> torch.Tensor:
    """CLS→patch attention maps of a batch of model-ready images.

    Parameters
    ----------
    backbone : Backbone
        From :func:`load_backbone`.
    images : torch.Tensor
        ``(N, C, H, W)`` normalised images, H and W multiples of the patch size,
        C = ``backbone.in_chans``.
    layer : int
        Block index (``-1`` = last, the paper's choice).
    head : "mean", "all" or int
        Average over heads (paper), keep every head, or one head.

    Returns
    -------
    torch.Tensor
        float32 ``(N, gh, gw)`` for ``"mean"`` or an int, ``(N, heads, gh, gw)`` for ``"all"``.
        The softmax runs over all tokens; prefix tokens are dropped afterwards.
    """
    if images.ndim != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {tuple(images.shape)}")
    if images.shape[1] != backbone.in_chans:
        raise ValueError(f"images have {images.shape[1]} channels but {backbone.name} takes "
                         f"{backbone.in_chans}; choose {backbone.in_chans} image channels.")
    ph, pw = backbone.patch_size
    if images.shape[-2] % ph or images.shape[-1] % pw:
        raise ValueError(f"image size {tuple(images.shape[-2:])} is not a multiple of the patch "
                         f"size {backbone.patch_size}; prepare it with prepare_image().")
    idx = _resolve_layer(backbone.depth, layer)
    row, grid = backbone.adapter.cls_row(backbone.model, images, idx, backbone.num_prefix_tokens)
    maps = row.reshape(row.shape[0], row.shape[1], *grid)
    if head == "mean":
        return maps.mean(dim=1)
    if head == "all":
        return maps
    if isinstance(head, int) and 0 <= head < maps.shape[1]:
        return maps[:, head]
    raise ValueError(f"head must be 'mean', 'all' or an int in 0..{maps.shape[1] - 1}, "
                     f"got {head!r}")
