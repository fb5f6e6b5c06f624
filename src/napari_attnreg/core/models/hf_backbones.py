"""Hugging Face transformers ViTs (ViTModel, Dinov2Model, Dinov2WithRegistersModel).

Patch size, prefix tokens (CLS + registers), channels and input size come from the model's
config; mean/std from its image processor config when there is one. The CLS row is computed
by the adapter in :mod:`~napari_attnreg.core.models.hf_attention`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from napari_attnreg.core.models.base import Backbone, channel_stats
from napari_attnreg.core.models.errors import BackboneError
from napari_attnreg.core.models.hf_attention import TRANSFORMERS, as_pair
from napari_attnreg.core.models.hub import call_hub
from napari_attnreg.core.models.weights import WEIGHT_SUFFIXES

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
    patch = as_pair(config.patch_size)
    image = as_pair(config.image_size)
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
                           if p.suffix.lower() in WEIGHT_SUFFIXES)
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
    model = _folder_model(AutoModel, folder)
    pre_path = folder / PREPROCESSOR_FILE
    pre = json.loads(pre_path.read_text()) if pre_path.is_file() else None
    return from_transformers_module(model, name=name or folder.name, weights=str(folder),
                                    preprocessor=pre)


def _folder_model(auto_model: Any, folder: Path) -> nn.Module:
    """The folder's model; a pickled weights file with more than tensors is refused in our
    words (torch's own message suggests turning its safety check off)."""
    import pickle

    try:
        return auto_model.from_pretrained(str(folder))
    except pickle.UnpicklingError:
        pickled = ", ".join(sorted(p.name for p in folder.iterdir()
                                   if p.suffix.lower() in (".bin", ".pt", ".pth", ".ckpt")))
        raise BackboneError(
            f"The weights in {folder} ({pickled or 'a pickle file'}) were refused: they hold "
            "Python objects besides tensors, which could run code when loaded. Convert them "
            "to model.safetensors where you trust the file (load the model with transformers "
            "there and save_pretrained it), or download the model's .safetensors "
            "version.") from None
    except (OSError, RuntimeError, ValueError) as err:  # missing, truncated or mismatched
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise BackboneError(f"Cannot load the transformers model in {folder}: {text}") from err


def load_hub(repo: str, *, name: str) -> Backbone:
    """Download (or take from the cache) a transformers model and its image processor config."""
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
