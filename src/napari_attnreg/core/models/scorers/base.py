"""What a map (scorer) is: token scores of a batch of prepared images, and what it needs.

A scorer turns ``(N, C, H, W)`` model-ready images into float32 token scores ``(N, T)`` on
the patch grid (prefix tokens dropped). The engines call it identically for the observed
image and for every chunk of null images. Each variant is one subclass that implements
:meth:`Scorer.scores`; the shared checks and the gradient plumbing live here and in
:mod:`.parts`, so a new map is one new module and one :func:`~.register` line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from napari_attnreg.core.models.base import Backbone
from napari_attnreg.core.models.scorers.target import Target, resolve_target


@dataclass(frozen=True)
class Needs:
    """What a map needs from the model and what its scores are.

    Attributes
    ----------
    gradients : bool
        Scores come from a backward pass (run under ``torch.enable_grad()``, eval mode).
    target : bool
        Scores depend on a class logit or a concept (``target=``).
    all_layers : bool
        Scores use the attention of every block, not one.
    signed : bool
        Scores can be negative (the step-down then tests ``max(x, 0)`` or ``max(-x, 0)``).
    family : str or None
        ``"heads"``: the scores are ``(N, H, T)`` and every head is a family of its own.
    cls_heads : bool
        Scores are made of every head's CLS attention of ``layer`` (:meth:`Scorer.from_heads`);
        the engines compute that once per chunk and read the map from it.
    shares : bool
        Scores are attention shares (softmax rows, > 0): the pooled-null procedures take
        their logs. Other maps (gradients) are tested on their own scale.
    """

    gradients: bool = False
    target: bool = False
    all_layers: bool = False
    signed: bool = False
    family: str | None = None
    cls_heads: bool = False
    shares: bool = True


@dataclass(frozen=True)
class Scorer:
    """Base of every map. Subclasses set ``name``, ``needs``, ``label`` and :meth:`scores`.

    Parameters
    ----------
    layer : int
        The block whose attention the map reads (attention maps; ``-1`` = last).
    head : "mean" or int
        Head mean or one head (the ``attention`` map).
    target : Target
        The class or concept of a class map (see :func:`resolve_target`).
    """

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    needs: ClassVar[Needs] = Needs()

    layer: int = -1
    head: str | int = "mean"
    target: Target = Target()

    def check(self, backbone: Backbone) -> None:
        """Raise a ValueError before any work when ``backbone`` cannot give this map."""
        if self.needs.target:
            self.target.check(backbone, self.name)

    def bind(self, backbone: Backbone, observed: torch.Tensor) -> Scorer:
        """This scorer with its target fixed on the observed image (``"predicted"`` → a class).

        Every null image is then scored for the observed image's class, never its own.
        """
        if not self.needs.target:
            return self
        return replace(self, target=resolve_target(self.target, backbone, observed))

    def score(self, backbone: Backbone, batch: torch.Tensor) -> torch.Tensor:
        """float32 token scores ``(N, T)`` (``(N, H, T)`` for a head family)."""
        check_batch(backbone, batch)
        if self.needs.gradients:  # they leave inference mode themselves, per chunk
            return self.scores(backbone, batch).float()
        with torch.no_grad():  # no graph, whether or not the caller is in inference mode
            return self.scores(backbone, batch).float()

    def scores(self, backbone: Backbone, batch: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement scores()")

    def from_heads(self, heads: torch.Tensor) -> torch.Tensor:
        """The scores read from every head's CLS attention ``(N, H, T)`` of ``layer``
        (maps with ``needs.cls_heads``)."""
        raise NotImplementedError(f"map={self.name!r} is not made of the CLS attention rows")

    @property
    def cls_head(self) -> str | int:
        """The ``head=`` of :func:`cls_attention` that gives this map (``needs.cls_heads``)."""
        raise NotImplementedError(f"map={self.name!r} is not made of the CLS attention rows")

    def describe(self) -> dict[str, Any]:
        """The map's options as the result's metadata stores them."""
        return {"map": self.name, "map_label": self.label, "map_signed": self.needs.signed,
                "target": self.target.describe() if self.needs.target else None}


def check_batch(backbone: Backbone, batch: torch.Tensor) -> None:
    """A batch of model-ready images: 4-D, the model's channels, whole patches."""
    if batch.ndim != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {tuple(batch.shape)}")
    if batch.shape[1] != backbone.in_chans:
        raise ValueError(f"images have {batch.shape[1]} channels but {backbone.name} takes "
                         f"{backbone.in_chans}; choose {backbone.in_chans} image channels.")
    ph, pw = backbone.patch_size
    if batch.shape[-2] % ph or batch.shape[-1] % pw:
        raise ValueError(f"image size {tuple(batch.shape[-2:])} is not a multiple of the patch "
                         f"size {backbone.patch_size}; prepare it with prepare_image().")
