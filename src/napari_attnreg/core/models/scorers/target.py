"""The target of a class map: the predicted class, a class index, or a concept vector.

A classifier scores a class by its logit. A foundation model has no classification head, so
its class maps score a **concept**: the cosine similarity of the image's final-norm CLS
token (timm's ``forward_features(x)[:, 0]``, transformers' ``last_hidden_state[:, 0]``)
with a vector of the model's width, for example the mean CLS token of a few example images
(:func:`napari_attnreg.concept_from`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from napari_attnreg.core.models.base import Backbone
from napari_attnreg.core.models.hf_attention import is_transformers_module

PREDICTED = "predicted"


@dataclass(frozen=True)
class Target:
    """What a class map scores.

    Attributes
    ----------
    kind : {"predicted", "class", "concept"}
    index : int or None
        The class of ``kind="class"``.
    concept : np.ndarray or None
        float32 vector of the model's width for ``kind="concept"``.
    """

    kind: str = PREDICTED
    index: int | None = None
    concept: np.ndarray | None = field(default=None, compare=False, repr=False)

    def check(self, backbone: Backbone, map_name: str) -> None:
        """Raise a ValueError when ``backbone`` cannot score this target."""
        if self.kind == "concept":
            width = backbone.embed_dim
            if self.concept is None or self.concept.shape != (width,):
                shape = None if self.concept is None else self.concept.shape
                raise ValueError(f"target: a concept of {backbone.name} is a vector of its width "
                                 f"{width}, got shape {shape}; build one with "
                                 "napari_attnreg.concept_from(examples, model).")
            return
        classes = num_classes(backbone)
        if classes == 0:
            # every front end meets this message: each one's way to give a concept is named
            raise ValueError(
                f"map={map_name!r} scores a class, and {backbone.name} has no classification "
                f"head (a foundation model): give it a concept to score, a vector of the "
                f"model's width {backbone.embed_dim} (command line: --concept FILE, a saved "
                ".npy vector or example images of the concept; napari and the notebook: "
                "Concept from ROI; Python: target=<concept>, which "
                "napari_attnreg.concept_from(example_images, model) builds), or use "
                "map=\"attention\".")
        if self.kind == "class" and not 0 <= int(self.index) < classes:
            raise ValueError(f"target={self.index}: {backbone.name} has {classes} classes; use "
                             f"a class index 0..{classes - 1} or target='predicted'.")

    def describe(self) -> Any:
        """``"predicted"``, the class index, or ``"concept"`` (for metadata and names)."""
        return self.index if self.kind == "class" else self.kind


def as_target(value: Any) -> Target:
    """A :class:`Target` from ``"predicted"``, a class index or a concept vector."""
    if isinstance(value, Target):
        return value
    if value is None or (isinstance(value, str) and value == PREDICTED):
        return Target()
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"target={value!r}: use 'predicted', a class index or a concept vector.")
    if isinstance(value, (int, np.integer)):
        return Target("class", int(value))
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    vector = np.asarray(value, dtype=np.float32) if not isinstance(value, str) else None
    if vector is None or vector.ndim != 1 or not np.all(np.isfinite(vector)) or not vector.any():
        raise ValueError(f"target={value!r}: use 'predicted', a class index, or a concept (a "
                         "non-zero 1-D vector of the model's width).")
    return Target("concept", concept=vector)


def num_classes(backbone: Backbone) -> int:
    """Classes of the model's head; 0 for a model without one (transformers base models)."""
    model = backbone.model
    if is_transformers_module(model) or not hasattr(model, "forward_head"):
        return 0
    return int(getattr(model, "num_classes", 0) or 0)


def final_cls(backbone: Backbone, x: torch.Tensor) -> torch.Tensor:
    """The final-norm CLS token ``(N, D)`` of a batch of model-ready images."""
    model = backbone.model
    if is_transformers_module(model):
        extra = {"interpolate_pos_encoding": True} if model.config.model_type == "vit" else {}
        return model(pixel_values=x, **extra).last_hidden_state[:, 0]
    return model.forward_features(x)[:, 0]


def class_logits(backbone: Backbone, x: torch.Tensor) -> torch.Tensor:
    """``(N, classes)`` logits of a timm classifier."""
    model = backbone.model
    return model.forward_head(model.forward_features(x))


def target_score(target: Target, backbone: Backbone, x: torch.Tensor) -> torch.Tensor:
    """``(N,)`` float32: the class logit, or the cosine similarity with the concept."""
    if target.kind == "concept":
        cls = final_cls(backbone, x).float()
        concept = torch.as_tensor(target.concept, device=cls.device, dtype=torch.float32)
        return F.cosine_similarity(cls, concept[None], dim=-1)
    if target.kind != "class":
        raise ValueError("target='predicted' is fixed on the observed image first "
                         "(Scorer.bind); score a class index or a concept.")
    return class_logits(backbone, x)[:, int(target.index)].float()


def resolve_target(target: Target, backbone: Backbone, observed: torch.Tensor) -> Target:
    """``"predicted"`` → the observed image's top class; other targets unchanged."""
    if target.kind != PREDICTED:
        return target
    with torch.no_grad():
        logits = class_logits(backbone, observed[:1])
    return Target("class", int(logits[0].argmax()))
