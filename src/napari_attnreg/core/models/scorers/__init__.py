"""Maps (scorers): one module per map, all behind :class:`~.base.Scorer`.

``make_scorer("cdam", target=concept)`` gives a configured scorer whose
``score(backbone, batch)`` returns float32 token scores ``(N, T)``; ``needs`` says what it
needs (gradients, a class head or concept, all layers) and whether it is signed or a family
of heads. Adding a map is one new module and one line in :data:`SCORERS`.
"""

from __future__ import annotations

from typing import Any

from napari_attnreg.core.models.scorers.attention import AttentionScorer
from napari_attnreg.core.models.scorers.base import Needs, Scorer
from napari_attnreg.core.models.scorers.cdam import CdamScorer
from napari_attnreg.core.models.scorers.gradcam import GradCamScorer
from napari_attnreg.core.models.scorers.heads import HeadsScorer
from napari_attnreg.core.models.scorers.rollout import RolloutScorer
from napari_attnreg.core.models.scorers.target import Target, as_target

SCORERS: dict[str, type[Scorer]] = {
    cls.name: cls for cls in (AttentionScorer, HeadsScorer, RolloutScorer, CdamScorer,
                              GradCamScorer)
}
DEFAULT_MAP = AttentionScorer.name

__all__ = ["DEFAULT_MAP", "SCORERS", "Needs", "Scorer", "Target", "as_target", "make_scorer",
           "map_names", "scorer_class"]


def map_names() -> tuple[str, ...]:
    """The registered maps, the default first."""
    return tuple(SCORERS)


def scorer_class(name: str) -> type[Scorer]:
    """The class of map ``name``; a ValueError listing the maps otherwise."""
    try:
        return SCORERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"map={name!r} is not a map; use one of "
                         f"{', '.join(repr(n) for n in SCORERS)}.") from None


def make_scorer(name: str = DEFAULT_MAP, *, layer: int = -1, head: str | int = "mean",
                target: Any = "predicted") -> Scorer:
    """A configured scorer: ``map=name`` with its layer, head and target."""
    return scorer_class(name)(layer=layer, head=head, target=as_target(target))
