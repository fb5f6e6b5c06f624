"""CLS-row attention for transformers ViTs (ViTModel, Dinov2Model, Dinov2WithRegistersModel).

The model's own forward (its embeddings, position-embedding interpolation and SDPA layers)
runs up to the chosen layer; then only the CLS query's attention row is formed, in float32.
Kept apart from :mod:`hf_backbones` (loading) so a :class:`~.base.Backbone` can pick this
adapter without importing the loaders; transformers itself is never imported here.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from napari_attnreg.core.models.entering import Entering
from napari_attnreg.core.models.errors import BackboneError


def is_transformers_module(module: nn.Module) -> bool:
    """A transformers ``PreTrainedModel`` (checked without importing transformers)."""
    return any(c.__module__.startswith("transformers.") for c in type(module).__mro__)


def as_pair(value: Any) -> tuple[int, int]:
    """A config's ``patch_size`` / ``image_size`` (an int or a pair) as ``(height, width)``."""
    if isinstance(value, (tuple, list)):
        return int(value[0]), int(value[1])
    return int(value), int(value)


class _Stop(Exception):
    """Raised from a pre-hook to end the forward once the chosen layer's input is known."""


def transformer_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer layers, wherever this transformers version keeps them."""
    for path in ("encoder.layer", "layers", "encoder.layers"):
        obj: Any = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, nn.ModuleList):
            return obj
    raise BackboneError(f"Cannot find the transformer layers of {type(model).__name__}.")


def norm_and_projections(layer: nn.Module) -> tuple[nn.Module, nn.Linear, nn.Linear]:
    """Pre-attention layernorm and query/key projections (transformers 5 and 4 layouts)."""
    norm = getattr(layer, "norm1", None) or getattr(layer, "layernorm_before", None)
    attn = layer.attention
    if hasattr(attn, "q_proj"):
        return norm, attn.q_proj, attn.k_proj
    return norm, attn.attention.query, attn.attention.key


class TransformersAdapter:
    """How a :class:`~.base.Backbone` reads a transformers ViT."""

    family = "transformers"

    def depth(self, model: nn.Module) -> int:
        return len(transformer_layers(model))

    def num_heads(self, model: nn.Module) -> int:
        return int(model.config.num_attention_heads)

    def embed_dim(self, model: nn.Module) -> int:
        return int(model.config.hidden_size)

    def cls_row(self, model: nn.Module, x: torch.Tensor, idx: int,
                num_prefix: int) -> tuple[torch.Tensor, tuple[int, int]]:
        entering = self.entering(model, x, idx)
        return self.row(model, entering, num_prefix), entering.grid

    def entering(self, model: nn.Module, x: torch.Tensor, idx: int) -> Entering:
        """What layer ``idx`` is called with: the model's own forward, stopped there."""
        layer = transformer_layers(model)[idx]
        captured: dict[str, Any] = {}
        owner = threading.get_ident()

        def grab(_module, args, kwargs):
            if threading.get_ident() != owner:  # another run's forward on this shared model
                return None
            captured.update(args=args, kwargs=kwargs)
            raise _Stop

        handle = layer.register_forward_pre_hook(grab, with_kwargs=True)
        # ViTModel resamples its position embedding only when asked; DINOv2 always does
        extra = {"interpolate_pos_encoding": True} if model.config.model_type == "vit" else {}
        try:
            model(pixel_values=x, **extra)
        except _Stop:
            pass
        finally:
            handle.remove()
        args, kwargs = captured["args"], dict(captured["kwargs"])
        hidden = args[0] if args else kwargs["hidden_states"]
        ph, pw = as_pair(model.config.patch_size)
        return Entering(idx, hidden, (x.shape[-2] // ph, x.shape[-1] // pw), args, kwargs)

    def row(self, model: nn.Module, entering: Entering, num_prefix: int) -> torch.Tensor:
        """The CLS row (N, heads, patches) float32 of ``model``'s layer that ``entering``
        enters."""
        norm, q_proj, k_proj = norm_and_projections(transformer_layers(model)[entering.idx])
        hidden = norm(entering.tokens)
        heads = int(model.config.num_attention_heads)
        n, length, _ = hidden.shape
        q = q_proj(hidden[:, :1]).view(n, 1, heads, -1).transpose(1, 2)
        k = k_proj(hidden).view(n, length, heads, -1).transpose(1, 2)
        # float32 here even under bf16 autocast: low-precision logits tie ranks
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            logits = (q.float() * q.shape[-1] ** -0.5) @ k.float().transpose(-1, -2)
            return F.softmax(logits, dim=-1)[:, :, 0, num_prefix:]

    def __repr__(self) -> str:
        return "TransformersAdapter()"


TRANSFORMERS = TransformersAdapter()
