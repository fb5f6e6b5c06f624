"""Hugging Face transformers ViTs (ViTModel, Dinov2Model, Dinov2WithRegistersModel).

Patch size, prefix tokens (CLS + registers), channels and input size come from the model's
config; mean/std from its image processor config when there is one. The CLS row runs the
model's own forward (its embeddings, position-embedding interpolation and SDPA layers) up
to the chosen layer, then forms only the CLS query's attention row.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from napari_attnreg.core.models.backbones import Backbone, channel_stats
from napari_attnreg.core.models.errors import BackboneError

SUPPORTED_TYPES = ("vit", "dinov2", "dinov2_with_registers")
# what each family's image processor uses when a checkpoint ships no preprocessor_config.json
_FAMILY_STATS = {
    "vit": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "dinov2": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "dinov2_with_registers": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}
PREPROCESSOR_FILE = "preprocessor_config.json"


def require_transformers() -> None:
    """transformers is an optional dependency: say how to get it."""
    try:
        import transformers  # noqa: F401
    except ImportError as err:
        raise BackboneError(
            "This model needs the transformers library: pip install \"napari-attnreg[hf]\" "
            "(or pip install transformers).") from err


def is_transformers_module(module: nn.Module) -> bool:
    """A transformers ``PreTrainedModel`` (checked without importing transformers)."""
    return any(c.__module__.startswith("transformers.") for c in type(module).__mro__)


def from_transformers_module(module: nn.Module, *, name: str, weights: str,
                             preprocessor: dict | None = None) -> Backbone:
    """Wrap a transformers ViT-family model (a task model is reduced to its base model)."""
    base = getattr(module, "base_model", module)
    config = getattr(base, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_TYPES:
        raise BackboneError(
            f"{type(module).__name__} (model_type {model_type!r}) is not supported; use a "
            f"transformers model of type {', '.join(SUPPORTED_TYPES)} (ViTModel, Dinov2Model, "
            "Dinov2WithRegistersModel) or a timm ViT.")
    patch = _pair(config.patch_size)
    image = _pair(config.image_size)
    in_chans = int(config.num_channels)
    registers = int(getattr(config, "num_register_tokens", 0) or 0)
    pre = preprocessor or {}
    family_mean, family_std = _FAMILY_STATS[model_type]
    mean, std = channel_stats(pre.get("image_mean", family_mean), pre.get("image_std", family_std),
                              in_chans)
    size = _processor_size(pre) or image
    return Backbone(
        model=base.eval(),
        name=name,
        weights=weights,
        patch_size=patch,
        num_prefix_tokens=1 + registers,
        mean=mean,
        std=std,
        input_size=(in_chans, size[0], size[1]),
        adapter=TRANSFORMERS,
    )


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        return int(value[0]), int(value[1])
    return int(value), int(value)


def _processor_size(pre: dict) -> tuple[int, int] | None:
    """Model input size from an image processor config: the crop, else the resize target."""
    for key, flag in (("crop_size", "do_center_crop"), ("size", "do_resize")):
        size = pre.get(key) if pre.get(flag, True) else None
        if isinstance(size, dict):
            if "height" in size and "width" in size:
                return int(size["height"]), int(size["width"])
            if "shortest_edge" in size:
                return int(size["shortest_edge"]), int(size["shortest_edge"])
        elif isinstance(size, int):
            return size, size
    return None


def load_transformers(source: str, *, pretrained: bool = True) -> Backbone:
    """From ``"hf:org/name"`` or a folder saved with ``save_pretrained`` (config.json inside)."""
    require_transformers()
    folder = Path(source)
    if not source.startswith("hf:"):
        if not (folder / "config.json").is_file():
            files = sorted(p.name for p in folder.iterdir()
                           if p.suffix.lower() in (".safetensors", ".pth", ".pt", ".ckpt", ".bin"))
            inside = (f" It holds {', '.join(files[:5])}: give that file's path with arch=... "
                      "(CLI: --arch) instead of the folder." if files else "")
            raise BackboneError(f"{folder} has no config.json; give a folder saved with "
                                f"save_pretrained, or a weights file with arch=....{inside}")
        return _load_folder(folder)
    repo = source.removeprefix("hf:")
    if not pretrained:
        model = _random_init(_hub_config(repo))
        return from_transformers_module(model, name=source, weights="random-init")
    return load_hub(repo, name=source)


def _load_folder(folder: Path, *, name: str | None = None) -> Backbone:
    from transformers import AutoConfig, AutoModel

    _check_type(AutoConfig.from_pretrained(str(folder)), str(folder))
    model = AutoModel.from_pretrained(str(folder))
    pre_path = folder / PREPROCESSOR_FILE
    pre = json.loads(pre_path.read_text()) if pre_path.is_file() else None
    return from_transformers_module(model, name=name or folder.name, weights=str(folder),
                                    preprocessor=pre)


def load_hub(repo: str, *, name: str) -> Backbone:
    """Download (or take from the cache) a transformers model and its image processor config."""
    from napari_attnreg.core.models.hub import call_hub

    require_transformers()
    alternative = (f"load_backbone('path/to/{repo.split('/')[-1]}') with the folder holding "
                   "config.json and model.safetensors")

    def load(local_only: bool) -> tuple[nn.Module, dict | None]:
        from transformers import AutoConfig, AutoModel

        _check_type(AutoConfig.from_pretrained(repo, local_files_only=local_only), repo)
        model = AutoModel.from_pretrained(repo, local_files_only=local_only)
        return model, _hub_preprocessor(repo, local_only)

    model, pre = call_hub(repo, load, offline_alternative=alternative)
    return from_transformers_module(model, name=name, weights="pretrained", preprocessor=pre)


def _hub_preprocessor(repo: str, local_only: bool) -> dict | None:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        path = hf_hub_download(repo, PREPROCESSOR_FILE, local_files_only=local_only)
    except EntryNotFoundError:  # no image processor config: the family default applies
        return None
    return json.loads(Path(path).read_text())


def _hub_config(repo: str):
    from transformers import AutoConfig

    from napari_attnreg.core.models.hub import call_hub

    return call_hub(repo,
                    lambda local_only: AutoConfig.from_pretrained(repo,
                                                                  local_files_only=local_only),
                    offline_alternative="a folder saved with save_pretrained")


def _check_type(config: Any, where: str) -> None:
    if getattr(config, "model_type", None) not in SUPPORTED_TYPES:
        raise BackboneError(
            f"{where} is a transformers '{getattr(config, 'model_type', '?')}' model; "
            "supported are "
            f"{', '.join(SUPPORTED_TYPES)}. For other architectures use a timm model.")


def config_for(model_type: str, **config_kwargs: Any):
    """A transformers config of ``model_type`` (for catalogue entries and tests)."""
    require_transformers()
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **config_kwargs)


def _random_init(config: Any) -> nn.Module:
    from transformers import AutoModel

    _check_type(config, config.model_type)
    return AutoModel.from_config(config)


def random_init(model_type: str, **config_kwargs: Any) -> nn.Module:
    """A random-init transformers model of ``model_type`` built offline from config values."""
    return _random_init(config_for(model_type, **config_kwargs))


# ---------------------------------------------------------------- the CLS row
class _Stop(Exception):
    """Raised from a pre-hook to end the forward once the chosen layer's input is known."""


def _layers(model: nn.Module) -> nn.ModuleList:
    """The transformer layers, wherever this transformers version keeps them."""
    for path in ("encoder.layer", "layers", "encoder.layers"):
        obj: Any = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, nn.ModuleList):
            return obj
    raise BackboneError(f"Cannot find the transformer layers of {type(model).__name__}.")


def _norm_and_projections(layer: nn.Module) -> tuple[nn.Module, nn.Linear, nn.Linear]:
    """Pre-attention layernorm and query/key projections (transformers 5 and 4 layouts)."""
    norm = getattr(layer, "norm1", None) or getattr(layer, "layernorm_before", None)
    attn = layer.attention
    if hasattr(attn, "q_proj"):
        return norm, attn.q_proj, attn.k_proj
    return norm, attn.attention.query, attn.attention.key


class TransformersAdapter:
    """How a :class:`Backbone` reads a transformers ViT."""

    family = "transformers"

    def depth(self, model: nn.Module) -> int:
        return len(_layers(model))

    def num_heads(self, model: nn.Module) -> int:
        return int(model.config.num_attention_heads)

    def embed_dim(self, model: nn.Module) -> int:
        return int(model.config.hidden_size)

    def cls_row(self, model: nn.Module, x: torch.Tensor, idx: int,
                num_prefix: int) -> tuple[torch.Tensor, tuple[int, int]]:
        layer = _layers(model)[idx]
        captured: dict[str, torch.Tensor] = {}
        owner = threading.get_ident()

        def grab(_module, args, kwargs):
            if threading.get_ident() != owner:  # another run's forward on this shared model
                return None
            captured["hidden"] = args[0] if args else kwargs["hidden_states"]
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
        norm, q_proj, k_proj = _norm_and_projections(layer)
        hidden = norm(captured["hidden"])
        heads = int(model.config.num_attention_heads)
        n, length, _ = hidden.shape
        q = q_proj(hidden[:, :1]).view(n, 1, heads, -1).transpose(1, 2)
        k = k_proj(hidden).view(n, length, heads, -1).transpose(1, 2)
        # float32 here even under bf16 autocast: low-precision logits tie ranks
        with torch.autocast(device_type=x.device.type, enabled=False):
            logits = (q.float() * q.shape[-1] ** -0.5) @ k.float().transpose(-1, -2)
            row = F.softmax(logits, dim=-1)[:, :, 0, num_prefix:]
        ph, pw = _pair(model.config.patch_size)
        return row, (x.shape[-2] // ph, x.shape[-1] // pw)

    def __repr__(self) -> str:
        return "TransformersAdapter()"


TRANSFORMERS = TransformersAdapter()
