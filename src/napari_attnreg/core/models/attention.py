"""CLS→patch attention of one transformer block, computed from the CLS query row only.

Every backbone family (timm classic, timm rotary, transformers) has an adapter whose
``cls_row`` runs the blocks before the chosen one as the library wrote them and then forms
only the CLS query's attention row in float32: no T×T matrix, later blocks skipped.
"""

from __future__ import annotations

from typing import Literal

import torch

from napari_attnreg.core.models.base import Backbone
from napari_attnreg.core.models.entering import Entering

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
    return cls_attention_entering(backbone, images, layer=layer, head=head)[0]


def cls_attention_entering(
    backbone: Backbone,
    images: torch.Tensor,
    *,
    layer: int = -1,
    head: HeadChoice = "mean",
) -> tuple[torch.Tensor, Entering | None]:
    """:func:`cls_attention`, and what entered the block (None for a model that only the
    explicit fallback reads): :func:`cls_attention_from` and :meth:`Entering.output` run
    that block again from it without the blocks before it."""
    _check_images(backbone, images)
    idx = _resolve_layer(backbone.depth, layer)
    adapter, npt = backbone.adapter, backbone.num_prefix_tokens
    entering = adapter.entering(backbone.model, images, idx)
    if entering is None:
        row, grid = adapter.cls_row(backbone.model, images, idx, npt)
    else:
        row, grid = adapter.row(backbone.model, entering, npt), entering.grid
    return _heads(row.reshape(row.shape[0], row.shape[1], *grid), head), entering


def cls_attention_from(backbone: Backbone, entering: Entering, *,
                       head: HeadChoice = "mean") -> torch.Tensor:
    """The CLS attention of ``backbone``'s block ``entering.idx`` for the tokens that entered
    it in another pass: a re-drawn copy of the block reads the trained blocks' output."""
    row = backbone.adapter.row(backbone.model, entering, backbone.num_prefix_tokens)
    return _heads(row.reshape(row.shape[0], row.shape[1], *entering.grid), head)


def _check_images(backbone: Backbone, images: torch.Tensor) -> None:
    if images.ndim != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {tuple(images.shape)}")
    if images.shape[1] != backbone.in_chans:
        raise ValueError(f"images have {images.shape[1]} channels but {backbone.name} takes "
                         f"{backbone.in_chans}; choose {backbone.in_chans} image channels.")
    ph, pw = backbone.patch_size
    if images.shape[-2] % ph or images.shape[-1] % pw:
        raise ValueError(f"image size {tuple(images.shape[-2:])} is not a multiple of the patch "
                         f"size {backbone.patch_size}; prepare it with prepare_image().")


def _heads(maps: torch.Tensor, head: HeadChoice) -> torch.Tensor:
    """``(N, heads, gh, gw)`` maps as ``head`` asks."""
    if head == "mean":
        return maps.mean(dim=1)
    if head == "all":
        return maps
    if isinstance(head, int) and 0 <= head < maps.shape[1]:
        return maps[:, head]
    raise ValueError(f"head must be 'mean', 'all' or an int in 0..{maps.shape[1] - 1}, "
                     f"got {head!r}")
